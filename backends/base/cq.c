/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The completion queue of the backends' worker threads: a locked list and an eventfd. See cq.h.
 * It logs nothing: an eventfd write cannot fail here (the counter does not overflow), and a read
 * that finds nothing (EAGAIN) is an ordinary spurious wake-up.
 */
#include <errno.h>
#include <stdint.h>
#include <sys/eventfd.h>
#include <unistd.h>
#include "cq.h"

int tpb_cq_init(struct tpb_cq *cq)
{
	int efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);

	cq->efd = -EBADF;
	if (efd < 0)
		return -errno;
	pthread_mutex_init(&cq->lock, NULL);
	tpu_list_init(&cq->ready);
	cq->efd = efd;
	return 0;
}

void tpb_cq_done(struct tpb_cq *cq)
{
	if (cq->efd < 0)
		return;
	tpu_close(cq->efd);
	cq->efd = -EBADF;
	pthread_mutex_destroy(&cq->lock);
}

void tpb_cq_wake(struct tpb_cq *cq)
{
	static const uint64_t one = 1;

	if (write(cq->efd, &one, sizeof(one)) < 0) {
		/* EAGAIN only at a count of 2^64 - 2: the fd is readable anyway */
	}
}

void tpb_cq_push(struct tpb_cq *cq, struct tpu_list *node)
{
	pthread_mutex_lock(&cq->lock);
	tpu_list_insert_tail(&cq->ready, node);
	pthread_mutex_unlock(&cq->lock);
	tpb_cq_wake(cq);
}

int tpb_cq_event_fd(const struct tpb_cq *cq)
{
	return cq->efd;
}

void tpb_cq_ack(struct tpb_cq *cq)
{
	uint64_t v;

	if (read(cq->efd, &v, sizeof(v)) < 0) {
		/* EAGAIN: nothing new since the last ack */
	}
}

struct tpu_list *tpb_cq_pop(struct tpb_cq *cq)
{
	struct tpu_list *n = NULL;

	pthread_mutex_lock(&cq->lock);
	if (!tpu_list_empty(&cq->ready)) {
		n = cq->ready.next;
		tpu_list_remove(n);
	}
	pthread_mutex_unlock(&cq->lock);
	return n;
}
