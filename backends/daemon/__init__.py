"""One llama.cpp engine per user, shared by every editor window (``kode engine run``).

paths.py      the runtime folder (owner and mode checked), socket, lock and log names
protocol.py   the framed msgspec messages between a window and the engine
scheduler.py  which generation runs next: keystrokes first, background work yields
server.py     the engine process: one model, many windows, idle shutdown
client.py     the ``Backend`` a window uses: connect, else start the engine; fall back
"""
