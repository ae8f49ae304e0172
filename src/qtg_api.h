/* qtg_api.h -- the HTTP API server (src/qtg_api.c): libmicrohttpd on the
 * host's loop, each request handled by require('qtg.api').handle(req) in a
 * host task.  The Lua module qtg.api_server starts it (lua/qtg/main.lua,
 * when MG_API_LISTEN is set); qtgd's other commands never bind a socket.
 *
 * The handler gets req = {method=, path=, query={name=value},
 * query_repeated={name=true}, headers={lower-case name=value}, body=,
 * listener=} and returns status, headers (table name -> value), body. */
#ifndef QTG_API_H
#define QTG_API_H

#include "qtg_host.h"

struct qtg_api;

#endif
