from fakes.sglang_io_struct import *  # noqa: F401,F403  (the request structs)
