/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The corpus replay driver the replay_* programs share: every file of the directories (or the
 * files) named on the command line, in name order, goes to the target's check; the program
 * prints "replayed N files, N failures".
 */
#ifndef TPT_FUZZ_REPLAY_H
#define TPT_FUZZ_REPLAY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Runs input @buf (@len bytes) of file @path, whose base name is @name (its expected verdict).
 * Return: true if the verdict met the name's expectation (after printing why not, false).
 * Borrows everything. */
typedef bool (*replay_check_fn)(const char *path, const char *name, const uint8_t *buf,
				size_t len);

/* True if @s starts with @prefix. */
bool replay_starts_with(const char *s, const char *prefix);

/*
 * replay_main() - replay every file named by argv[1..] (directories: their files) through
 * @check. Return: the exit status, 0 if at least one file was read and every check held, else 1.
 */
int replay_main(int argc, char **argv, replay_check_fn check);

#endif
