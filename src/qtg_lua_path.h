/* qtg_lua_path.h -- the ownership and permission check on MG_LUA_PATH
 * (sshd StrictModes-like; see qtg_lua_path.c). */
#ifndef QTG_LUA_PATH_H
#define QTG_LUA_PATH_H

#include <stddef.h>

/* 0: scripts may be loaded from dir; -1 with a message naming the path. */
int qtg_lua_path_check(const char *dir, char *err, size_t errlen);

#endif
