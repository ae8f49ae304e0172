/* qtg_lua_path.c -- may policy scripts be loaded from MG_LUA_PATH?
 *
 * An override directory replaces the engine's own code, so whoever can write
 * there runs code as the daemon, next to the signing keys.  As sshd's
 * StrictModes does for authorized_keys: the directory, every directory
 * above it and every file and directory below it must be owned by root or
 * the daemon's user and writable by no one else (no group or other write
 * bit).  One exception above the directory: a root-owned directory with the
 * sticky bit (/tmp), where others may create entries but not replace ours.
 * A link that points nowhere is refused too (its target may appear later).
 * The check runs at start, at every reload, and before any module is loaded
 * from the directory (qtg_host.c's searcher): a tree made writable, or a
 * file planted, after start is refused then, not only at the next start.
 */
#include "qtg_lua_path.h"

#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define QTG_LUA_PATH_MAX_DEPTH 8

static int qtg_lua_path_owner_ok(const struct stat *st) {
  return st->st_uid == 0 || st->st_uid == geteuid();
}

static int qtg_lua_path_entry(const char *path, const struct stat *st, char *err, size_t errlen) {
  if (!qtg_lua_path_owner_ok(st)) {
    snprintf(err, errlen, "MG_LUA_PATH: %s is owned by uid %lu, not root or this user (uid %lu): "
             "refusing to load policy scripts from it", path, (unsigned long)st->st_uid,
             (unsigned long)geteuid());
    return -1;
  }
  if (st->st_mode & (S_IWGRP | S_IWOTH)) {
    snprintf(err, errlen, "MG_LUA_PATH: %s is writable by %s (mode %04o): refusing to load policy "
             "scripts from it (chmod go-w %s)", path, (st->st_mode & S_IWOTH) ? "anyone" : "its group",
             (unsigned)(st->st_mode & 07777), path);
    return -1;
  }
  return 0;
}

static int qtg_lua_path_walk(const char *dir, int depth, char *err, size_t errlen) {
  if (depth > QTG_LUA_PATH_MAX_DEPTH) return 0;
  DIR *d = opendir(dir);
  if (d == NULL) {
    snprintf(err, errlen, "MG_LUA_PATH: cannot read %s: %s", dir, strerror(errno));
    return -1;
  }
  int rc = 0;
  struct dirent *e;
  while (rc == 0 && (e = readdir(d)) != NULL) {
    if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
    char path[PATH_MAX];
    struct stat st;
    if (snprintf(path, sizeof path, "%s/%s", dir, e->d_name) >= (int)sizeof path) continue;
    if (stat(path, &st) != 0) {
      /* a dangling link loads nothing now, but whoever may create its
       * target later decides what loads then */
      if (lstat(path, &st) == 0 && S_ISLNK(st.st_mode)) {
        snprintf(err, errlen, "MG_LUA_PATH: %s is a link to nothing: refusing to load policy scripts "
                 "from it (whoever creates its target chooses what runs; remove it)", path);
        rc = -1;
      }
      continue;
    }
    if (!S_ISDIR(st.st_mode) && !S_ISREG(st.st_mode)) continue;
    rc = qtg_lua_path_entry(path, &st, err, errlen);
    if (rc == 0 && S_ISDIR(st.st_mode)) rc = qtg_lua_path_walk(path, depth + 1, err, errlen);
  }
  closedir(d);
  return rc;
}

int qtg_lua_path_check(const char *dir, char *err, size_t errlen) {
  char *real = realpath(dir, NULL);
  struct stat st;
  if (real == NULL || stat(real, &st) != 0 || !S_ISDIR(st.st_mode)) {
    snprintf(err, errlen, "MG_LUA_PATH=%s is not a directory", dir);
    free(real);
    return -1;
  }
  int rc = qtg_lua_path_entry(real, &st, err, errlen);
  /* every directory above it, up to / */
  char up[PATH_MAX];
  snprintf(up, sizeof up, "%s", real);
  while (rc == 0) {
    char *slash = strrchr(up, '/');
    if (slash == NULL) break;
    if (slash == up) slash[1] = '\0';
    else *slash = '\0';
    if (stat(up, &st) != 0) break;
    int sticky_root = st.st_uid == 0 && (st.st_mode & S_ISVTX);
    if (!sticky_root) rc = qtg_lua_path_entry(up, &st, err, errlen);
    if (strcmp(up, "/") == 0) break;
  }
  if (rc == 0) rc = qtg_lua_path_walk(real, 0, err, errlen);
  free(real);
  return rc;
}
