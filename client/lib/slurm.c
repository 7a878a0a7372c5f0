/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Bootstrap from Slurm: reads the variables srun gives each task (job and step ids, rank, task
 * count, local id, node id, the step's node list and tasks per node), expands Slurm's compressed
 * host lists ("gn[01-04,10],gpu7") and tasks-per-node lists ("2(x3),1"), and derives a task's
 * rank, size, local rank and size, node, the group's key and its coordinator host. Every value
 * is hostile input: bounded by the TPC_SLURM_* limits, validated, refused with a reason in
 * tp_last_error(). Joining the group, and reaching the coordinator's daemon, are not done here.
 */
#include <stdio.h>
#include <string.h>
#include "internal.h"

#define QUOTE_MAX 40 /* characters of input quoted in an error message */

/* A bounded, printable copy of [@s, @s + @len) for a message ('?' for other bytes). */
static const char *quote(const char *s, size_t len, char buf[QUOTE_MAX + 4])
{
	size_t n = TPU_MIN(len, (size_t)QUOTE_MAX), i;

	for (i = 0; i < n; i++)
		buf[i] = s[i] >= 0x20 && s[i] < 0x7f ? s[i] : '?';
	if (len > n)
		memcpy(buf + i, "...", 3), i += 3;
	buf[i] = '\0';
	return buf;
}

static bool is_digit(char c)
{
	return c >= '0' && c <= '9';
}

static bool is_name_char(char c)
{
	return is_digit(c) || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '-' ||
	       c == '.' || c == '_';
}

static unsigned digits_of(uint64_t v)
{
	unsigned n = 1;

	while (v >= 10)
		v /= 10, n++;
	return n;
}

/* ---- host lists --------------------------------------------------------------------------- */

/* Parses a number of at most TPC_SLURM_DIGITS_MAX digits at *@p; advances *@p. */
static int hl_number(const char *s, const char **p, uint64_t *ret, unsigned *ret_width)
{
	const char *q = *p;
	uint64_t v = 0;

	if (*q == '-' || *q == '+')
		return tpc_error(-EINVAL, "host list: at character %zu: signed number", q - s + 1);
	if (*q == 'x')
		return tpc_error(-EINVAL, "host list: at character %zu: 3-D box ranges are not "
				 "supported", q - s + 1);
	if (!is_digit(*q))
		return tpc_error(-EINVAL, "host list: at character %zu: a number was expected in "
				 "brackets", q - s + 1);
	for (; is_digit(*q); q++) {
		if ((size_t)(q - *p) == TPC_SLURM_DIGITS_MAX)
			return tpc_error(-EMSGSIZE, "host list: at character %zu: number of more "
					 "than %u digits", *p - s + 1, TPC_SLURM_DIGITS_MAX);
		v = v * 10 + (uint64_t)(*q - '0');
	}
	*ret = v;
	*ret_width = (unsigned)(q - *p);
	*p = q;
	return 0;
}

/* Validates the bracket group at *@p (just after '['), up to and past its ']'; *@ret_count
 * gets the number of values it names. */
static int hl_group(const char *s, const char **p, uint64_t *ret_count)
{
	const char *q = *p;
	uint64_t count = 0, lo, hi;
	unsigned w;
	int r;

	for (;;) {
		if ((r = hl_number(s, &q, &lo, &w)) < 0)
			return r;
		hi = lo;
		if (*q == '-') {
			q++;
			if ((r = hl_number(s, &q, &hi, &w)) < 0)
				return r;
			if (hi < lo)
				return tpc_error(-EINVAL, "host list: at character %zu: descending "
						 "range %llu-%llu", q - s, (unsigned long long)lo,
						 (unsigned long long)hi);
			if (hi - lo >= TPC_SLURM_SPAN_MAX)
				return tpc_error(-ENOBUFS, "host list: at character %zu: range "
						 "%llu-%llu spans more than %u values", q - s,
						 (unsigned long long)lo, (unsigned long long)hi,
						 TPC_SLURM_SPAN_MAX);
		}
		count += hi - lo + 1;
		if (count > TPC_SLURM_HOSTS_MAX)
			return tpc_error(-ENOBUFS, "host list: at character %zu: more than %u hosts",
					 q - s, TPC_SLURM_HOSTS_MAX);
		if (*q == ']')
			break;
		if (*q == '\0')
			return tpc_error(-EINVAL, "host list: '[' at character %zu is never closed",
					 *p - s);
		if (*q == 'x')
			return tpc_error(-EINVAL, "host list: at character %zu: 3-D box ranges are "
					 "not supported", q - s + 1);
		if (*q != ',')
			return tpc_error(-EINVAL, "host list: at character %zu: '%c' in brackets",
					 q - s + 1, is_name_char(*q) || *q == '[' ? *q : '?');
		q++;
	}
	*ret_count = count;
	*p = q + 1;
	return 0;
}

/* One element of a list: literal text and bracket groups, lit[0] [g0] lit[1] [g1] ... */
struct hl_elem {
	const char *lit[TPC_SLURM_GROUPS_MAX + 1];
	size_t lit_len[TPC_SLURM_GROUPS_MAX + 1];
	const char *group[TPC_SLURM_GROUPS_MAX]; /* just after each '[' */
	unsigned ngroups;
	uint64_t hosts; /* names it expands to */
};

/* Validates the element at *@p, up to the ',' or NUL that ends it (not consumed). */
static int hl_elem_scan(const char *s, const char **p, struct hl_elem *e)
{
	const char *q = *p;
	uint64_t count = 0;
	int r;

	memset(e, 0, sizeof(*e));
	e->hosts = 1;
	e->lit[0] = q;
	for (;;) {
		if (*q == '\0' || *q == ',')
			break;
		if (*q == '[') {
			if (e->ngroups == TPC_SLURM_GROUPS_MAX)
				return tpc_error(-ENOBUFS, "host list: at character %zu: more than %u "
						 "bracket groups in one name", q - s + 1,
						 TPC_SLURM_GROUPS_MAX);
			e->lit_len[e->ngroups] = (size_t)(q - e->lit[e->ngroups]);
			e->group[e->ngroups] = ++q;
			if ((r = hl_group(s, &q, &count)) < 0)
				return r;
			/* Both are at most TPC_SLURM_HOSTS_MAX: no overflow. */
			e->hosts *= count;
			if (e->hosts > TPC_SLURM_HOSTS_MAX)
				return tpc_error(-ENOBUFS, "host list: at character %zu: more than %u "
						 "hosts", q - s, TPC_SLURM_HOSTS_MAX);
			e->lit[++e->ngroups] = q;
			continue;
		}
		if (*q == ']')
			return tpc_error(-EINVAL, "host list: at character %zu: ']' without '['",
					 q - s + 1);
		if (!is_name_char(*q))
			return tpc_error(-EINVAL, "host list: at character %zu: byte 0x%02x is not "
					 "allowed in a host name", q - s + 1, (unsigned char)*q);
		q++;
	}
	e->lit_len[e->ngroups] = (size_t)(q - e->lit[e->ngroups]);
	if (q == *p)
		return tpc_error(-EINVAL, "host list: at character %zu: empty host name",
				 q - s + 1);
	if (e->ngroups > 0 && e->lit_len[e->ngroups] > 0)
		return tpc_error(-EINVAL, "host list: at character %zu: text after the last ']' "
				 "(Slurm allows none)", e->lit[e->ngroups] - s + 1);
	*p = q;
	return 0;
}

/* Walks the values of one bracket group in order. */
struct hl_cursor {
	const char *next; /* the next range, or NULL after the last */
	uint64_t val, hi;
	unsigned width;
};

/* Loads the range at @c->next (syntax already checked by hl_group()). */
static void hl_cursor_load(struct hl_cursor *c)
{
	const char *q = c->next;
	uint64_t v = 0;

	for (c->width = 0; is_digit(*q); q++, c->width++)
		v = v * 10 + (uint64_t)(*q - '0');
	c->val = c->hi = v;
	if (*q == '-')
		for (q++, c->hi = 0; is_digit(*q); q++)
			c->hi = c->hi * 10 + (uint64_t)(*q - '0');
	c->next = *q == ',' ? q + 1 : NULL;
}

/* Advances to the next value. Return: false past the last (the cursor is then reset). */
static bool hl_cursor_step(struct hl_cursor *c, const char *group)
{
	if (c->val < c->hi) {
		c->val++;
		return true;
	}
	if (c->next) {
		hl_cursor_load(c);
		return true;
	}
	c->next = group;
	hl_cursor_load(c);
	return false;
}

struct hl_builder {
	struct tpc_hostlist *hl;
	size_t len, cap;  /* bytes of hl->names used and allocated */
	uint32_t cap_n;	  /* entries of hl->off allocated */
};

static int hl_push(struct hl_builder *b, const char *name, size_t len)
{
	struct tpc_hostlist *hl = b->hl;

	if (hl->n == b->cap_n) {
		uint32_t cap_n = b->cap_n ? b->cap_n * 2 : 16;
		uint32_t *off;

		cap_n = TPU_MIN(cap_n, TPC_SLURM_HOSTS_MAX);
		if (!(off = realloc(hl->off, cap_n * sizeof(*off))))
			return -ENOMEM;
		hl->off = off;
		b->cap_n = cap_n;
	}
	if (b->cap - b->len < len + 1) {
		size_t cap = TPU_MAX(b->cap * 2, b->len + len + 1 + 256);
		char *names = realloc(hl->names, cap);

		if (!names)
			return -ENOMEM;
		hl->names = names;
		b->cap = cap;
	}
	memcpy(hl->names + b->len, name, len);
	hl->names[b->len + len] = '\0';
	hl->off[hl->n++] = (uint32_t)b->len;
	b->len += len + 1;
	return 0;
}

/* Appends every name of @e, first group outermost, last group fastest (Slurm's order). */
static int hl_elem_expand(const char *s, struct hl_builder *b, const struct hl_elem *e)
{
	struct hl_cursor cur[TPC_SLURM_GROUPS_MAX];
	char name[TPC_SLURM_NAME_MAX + 1];
	char qb[QUOTE_MAX + 4];
	unsigned g;
	int r;

	for (g = 0; g < e->ngroups; g++) {
		cur[g].next = e->group[g];
		hl_cursor_load(&cur[g]);
	}
	do {
		size_t len = 0;

		for (g = 0; g <= e->ngroups; g++) {
			unsigned w = 0;

			if (g < e->ngroups)
				w = TPU_MAX(cur[g].width, digits_of(cur[g].val));
			if (len + e->lit_len[g] + w > TPC_SLURM_NAME_MAX)
				return tpc_error(-EMSGSIZE, "host list: at character %zu: host name "
						 "\"%s\" is longer than %u characters",
						 e->lit[0] - s + 1,
						 quote(e->lit[0], e->lit_len[0], qb),
						 TPC_SLURM_NAME_MAX);
			memcpy(name + len, e->lit[g], e->lit_len[g]);
			len += e->lit_len[g];
			if (g < e->ngroups)
				len += (size_t)snprintf(name + len, sizeof(name) - len, "%0*llu",
							(int)cur[g].width,
							(unsigned long long)cur[g].val);
		}
		if ((r = hl_push(b, name, len)) < 0)
			return tpc_error(r, "host list: out of memory");
		/* Odometer: the last group turns fastest. */
		for (g = e->ngroups; g > 0 && !hl_cursor_step(&cur[g - 1], e->group[g - 1]); g--)
			;
		if (g == 0)
			break;
	} while (true);
	return 0;
}

void tpc_slurm_hostlist_free(struct tpc_hostlist *hl)
{
	if (!hl)
		return;
	free(hl->off);
	free(hl->names);
	free(hl);
}

const char *tpc_slurm_hostlist_name(const struct tpc_hostlist *hl, uint32_t i)
{
	return hl->names + hl->off[i];
}

int tpc_slurm_hostlist_parse(const char *s, struct tpc_hostlist **ret)
{
	struct hl_builder b = { 0 };
	const char *p = s;
	struct hl_elem e;
	int r;

	if (strnlen(s, TPC_SLURM_LIST_MAX + 1) > TPC_SLURM_LIST_MAX)
		return tpc_error(-EMSGSIZE, "host list: longer than %u characters",
				 TPC_SLURM_LIST_MAX);
	if (*s == '\0')
		return tpc_error(-EINVAL, "host list: empty");
	if (!(b.hl = calloc(1, sizeof(*b.hl))))
		return tpc_error(-ENOMEM, "host list: out of memory");
	for (;;) {
		if ((r = hl_elem_scan(s, &p, &e)) < 0)
			goto fail;
		if (b.hl->n + e.hosts > TPC_SLURM_HOSTS_MAX) {
			r = tpc_error(-ENOBUFS, "host list: at character %zu: more than %u hosts",
				      p - s, TPC_SLURM_HOSTS_MAX);
			goto fail;
		}
		if ((r = hl_elem_expand(s, &b, &e)) < 0)
			goto fail;
		if (*p == '\0')
			break;
		p++; /* the ',' */
	}
	*ret = b.hl;
	return 0;
fail:
	tpc_slurm_hostlist_free(b.hl);
	return r;
}

/* ---- tasks per node ----------------------------------------------------------------------- */

/* A decimal number of at most 10 digits, <= @max, at *@p; advances *@p. */
static int tasks_number(const char *s, const char **p, uint64_t max, const char *what,
			uint32_t *ret)
{
	const char *q = *p;
	uint64_t v = 0;

	if (!is_digit(*q))
		return tpc_error(-EINVAL, "tasks per node: at character %zu: %s expected",
				 q - s + 1, what);
	for (; is_digit(*q); q++) {
		v = v * 10 + (uint64_t)(*q - '0');
		if (v > max)
			return tpc_error(-ENOBUFS, "tasks per node: at character %zu: %s over %llu",
					 *p - s + 1, what, (unsigned long long)max);
	}
	if (v == 0)
		return tpc_error(-EINVAL, "tasks per node: at character %zu: %s of 0",
				 *p - s + 1, what);
	*ret = (uint32_t)v;
	*p = q;
	return 0;
}

/* One pass over @s: the node count in *@ret_nodes; also fills @counts when not NULL. */
static int tasks_walk(const char *s, uint32_t *counts, uint32_t *ret_nodes, uint32_t *ret_total)
{
	const char *p = s;
	uint64_t nodes = 0, total = 0;
	uint32_t count, reps;
	int r;

	for (;;) {
		if ((r = tasks_number(s, &p, TPC_SLURM_RANKS_MAX, "a task count", &count)) < 0)
			return r;
		reps = 1;
		if (p[0] == '(') {
			if (p[1] != 'x')
				return tpc_error(-EINVAL, "tasks per node: at character %zu: \"(x\" "
						 "expected", p - s + 1);
			p += 2;
			if ((r = tasks_number(s, &p, TPC_SLURM_HOSTS_MAX, "a repeat count",
					      &reps)) < 0)
				return r;
			if (*p++ != ')')
				return tpc_error(-EINVAL, "tasks per node: at character %zu: ')' "
						 "expected", p - s);
		}
		if (nodes + reps > TPC_SLURM_HOSTS_MAX)
			return tpc_error(-ENOBUFS, "tasks per node: more than %u nodes",
					 TPC_SLURM_HOSTS_MAX);
		total += (uint64_t)count * reps;
		if (total > TPC_SLURM_RANKS_MAX)
			return tpc_error(-ENOBUFS, "tasks per node: more than %u tasks",
					 TPC_SLURM_RANKS_MAX);
		for (uint32_t i = 0; counts && i < reps; i++)
			counts[nodes + i] = count;
		nodes += reps;
		if (*p == '\0')
			break;
		if (*p++ != ',')
			return tpc_error(-EINVAL, "tasks per node: at character %zu: ',' expected",
					 p - s);
	}
	*ret_nodes = (uint32_t)nodes;
	if (ret_total)
		*ret_total = (uint32_t)total;
	return 0;
}

int tpc_slurm_tasks_parse(const char *s, uint32_t nodes, uint32_t **ret, uint32_t *ret_total)
{
	_cleanup_free_ uint32_t *counts = NULL;
	uint32_t n = 0, total = 0;
	int r;

	if (strnlen(s, TPC_SLURM_LIST_MAX + 1) > TPC_SLURM_LIST_MAX)
		return tpc_error(-EMSGSIZE, "tasks per node: longer than %u characters",
				 TPC_SLURM_LIST_MAX);
	if ((r = tasks_walk(s, NULL, &n, &total)) < 0)
		return r;
	if (n != nodes)
		return tpc_error(-EINVAL, "tasks per node: describes %u nodes, the node list has %u",
				 n, nodes);
	if (!(counts = calloc(n, sizeof(*counts))))
		return tpc_error(-ENOMEM, "tasks per node: out of memory");
	if ((r = tasks_walk(s, counts, &n, NULL)) < 0)
		return r;
	*ret = TAKE_PTR(counts);
	if (ret_total)
		*ret_total = total;
	return 0;
}

/* ---- the environment ---------------------------------------------------------------------- */

static const char *env2(const char *a, const char *b)
{
	const char *v = getenv(a);

	return v ? v : getenv(b);
}

void tpc_slurm_vars_from_env(struct tpc_slurm_vars *ret)
{
	*ret = (struct tpc_slurm_vars){
		.job_id = env2("SLURM_JOB_ID", "SLURM_JOBID"),
		.step_id = env2("SLURM_STEP_ID", "SLURM_STEPID"),
		.procid = getenv("SLURM_PROCID"),
		.ntasks = getenv("SLURM_NTASKS"),
		.nprocs = getenv("SLURM_NPROCS"),
		.step_num_tasks = getenv("SLURM_STEP_NUM_TASKS"),
		.localid = getenv("SLURM_LOCALID"),
		.nodeid = getenv("SLURM_NODEID"),
		.step_nodelist = getenv("SLURM_STEP_NODELIST"),
		.job_nodelist = env2("SLURM_JOB_NODELIST", "SLURM_NODELIST"),
		.step_tasks_per_node = getenv("SLURM_STEP_TASKS_PER_NODE"),
		.tasks_per_node = getenv("SLURM_TASKS_PER_NODE"),
	};
}

bool tpc_slurm_detected(const struct tpc_slurm_vars *v)
{
	return v->job_id && v->procid;
}

/* Variable @name = @val: a decimal number (at most 10 digits) <= @max. */
static int env_number(const char *name, const char *val, uint64_t max, uint32_t *ret)
{
	char qb[QUOTE_MAX + 4];
	uint64_t v = 0;
	size_t i;

	if (!val)
		return tpc_error(-ENOENT, "slurm: %s is not set", name);
	for (i = 0; is_digit(val[i]) && i < 10; i++)
		v = v * 10 + (uint64_t)(val[i] - '0');
	if (i == 0 || val[i] != '\0')
		return tpc_error(-EINVAL, "slurm: %s=\"%s\" is not a decimal number", name,
				 quote(val, strnlen(val, QUOTE_MAX + 1), qb));
	if (v > max)
		return tpc_error(-EINVAL, "slurm: %s=%llu is over %llu", name,
				 (unsigned long long)v, (unsigned long long)max);
	*ret = (uint32_t)v;
	return 0;
}

/* The task count: every one of the three variables that is set, and they must agree. */
static int env_size(const struct tpc_slurm_vars *v, uint32_t *ret)
{
	const struct {
		const char *name, *val;
	} src[] = {
		{ "SLURM_STEP_NUM_TASKS", v->step_num_tasks },
		{ "SLURM_NTASKS", v->ntasks },
		{ "SLURM_NPROCS", v->nprocs },
	};
	const char *first = NULL;
	uint32_t size = 0, n;
	int r;

	for (size_t i = 0; i < TPU_ARRAY_SIZE(src); i++) {
		if (!src[i].val)
			continue;
		if ((r = env_number(src[i].name, src[i].val, TPC_SLURM_RANKS_MAX, &n)) < 0)
			return r;
		if (n == 0)
			return tpc_error(-EINVAL, "slurm: %s=0", src[i].name);
		if (first && n != size)
			return tpc_error(-EINVAL, "slurm: %s=%u and %s=%u disagree", first, size,
					 src[i].name, n);
		if (!first)
			first = src[i].name, size = n;
	}
	if (!first)
		return tpc_error(-ENOENT, "slurm: none of SLURM_STEP_NUM_TASKS, SLURM_NTASKS and "
				 "SLURM_NPROCS is set");
	*ret = size;
	return 0;
}

/* Puts "slurm: @var: " before the message a parser left in tp_last_error(). Return: @err. */
static int env_rewrap(int err, const char *var)
{
	char msg[512];

	snprintf(msg, sizeof(msg), "%s", tp_last_error());
	return tpc_error(err, "slurm: %s: %s", var, msg);
}

/* Node list and tasks per node: the step's, else the job's. */
static int env_nodes(const struct tpc_slurm_vars *v, struct tpc_hostlist **ret_hl,
		     uint32_t **ret_counts, uint32_t *ret_total)
{
	const char *list = v->step_nodelist ? v->step_nodelist : v->job_nodelist;
	const char *list_name = v->step_nodelist ? "SLURM_STEP_NODELIST" : "SLURM_JOB_NODELIST";
	const char *tasks = v->step_tasks_per_node ? v->step_tasks_per_node : v->tasks_per_node;
	const char *tasks_name = v->step_tasks_per_node ? "SLURM_STEP_TASKS_PER_NODE" :
							  "SLURM_TASKS_PER_NODE";
	struct tpc_hostlist *hl = NULL;
	int r;

	if (!list)
		return tpc_error(-ENOENT, "slurm: neither SLURM_STEP_NODELIST nor "
				 "SLURM_JOB_NODELIST is set");
	if (!tasks)
		return tpc_error(-ENOENT, "slurm: neither SLURM_STEP_TASKS_PER_NODE nor "
				 "SLURM_TASKS_PER_NODE is set");
	if ((r = tpc_slurm_hostlist_parse(list, &hl)) < 0)
		return env_rewrap(r, list_name);
	if ((r = tpc_slurm_tasks_parse(tasks, hl->n, ret_counts, ret_total)) < 0) {
		tpc_slurm_hostlist_free(hl);
		return env_rewrap(r, tasks_name);
	}
	*ret_hl = hl;
	return 0;
}

int tpc_slurm_from_vars(const struct tpc_slurm_vars *v, struct tpc_slurm *ret)
{
	struct tpc_hostlist *hl = NULL;
	_cleanup_free_ uint32_t *counts = NULL;
	struct tpc_slurm t = { 0 };
	uint32_t total;
	int r;

	if ((r = env_number("SLURM_JOB_ID", v->job_id, UINT32_MAX, &t.job_id)) < 0 ||
	    (r = env_number("SLURM_STEP_ID", v->step_id, UINT32_MAX, &t.step_id)) < 0 ||
	    (r = env_number("SLURM_PROCID", v->procid, TPC_SLURM_RANKS_MAX - 1, &t.rank)) < 0 ||
	    (r = env_size(v, &t.size)) < 0 ||
	    (r = env_number("SLURM_LOCALID", v->localid, TPC_SLURM_RANKS_MAX - 1,
			    &t.local_rank)) < 0 ||
	    (r = env_number("SLURM_NODEID", v->nodeid, TPC_SLURM_HOSTS_MAX - 1, &t.node)) < 0)
		return r;
	if (t.rank >= t.size)
		return tpc_error(-EINVAL, "slurm: SLURM_PROCID=%u is not below the task count %u",
				 t.rank, t.size);
	if ((r = env_nodes(v, &hl, &counts, &total)) < 0)
		return r;
	t.nodes = hl->n;
	if (total != t.size)
		r = tpc_error(-EINVAL, "slurm: the tasks per node add up to %u, the task count is %u",
			      total, t.size);
	else if (t.node >= t.nodes)
		r = tpc_error(-EINVAL, "slurm: SLURM_NODEID=%u is not below the node count %u",
			      t.node, t.nodes);
	else if (t.local_rank >= counts[t.node])
		r = tpc_error(-EINVAL, "slurm: SLURM_LOCALID=%u is not below the %u tasks of "
			      "node %u", t.local_rank, counts[t.node], t.node);
	if (r == 0) {
		t.local_size = counts[t.node];
		snprintf(t.key, sizeof(t.key), "slurm:%u.%u", t.job_id, t.step_id);
		snprintf(t.coordinator, sizeof(t.coordinator), "%s",
			 tpc_slurm_hostlist_name(hl, 0));
		snprintf(t.node_name, sizeof(t.node_name), "%s",
			 tpc_slurm_hostlist_name(hl, t.node));
		*ret = t;
	}
	tpc_slurm_hostlist_free(hl);
	return r;
}

int tpc_slurm_from_env(struct tpc_slurm *ret)
{
	struct tpc_slurm_vars v;

	tpc_slurm_vars_from_env(&v);
	return tpc_slurm_from_vars(&v, ret);
}
