-- API trampoline (src/qtg_api.c): one HTTP request, handed to qtg.api.
return require('qtg.api').handle(...)
