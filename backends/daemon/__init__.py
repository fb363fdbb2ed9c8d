"""One llama.cpp engine per user, shared by every editor window (``kode engine run``).

paths.py      the runtime folder (owner and mode checked), socket, lock and log names
protocol.py   the framed msgspec messages between a window and the engine
scheduler.py  which generation runs next: keystrokes first, background work yields
server.py     the engine process: one model, many windows, idle shutdown
client.py     the ``Backend`` a window uses: one backend current at a time, the shared
              engine or, when it cannot be had, the window's own model; no mode branches
engine_backend.py  the shared engine as a window's backend: the connection, one restart,
              the window's estimates of the engine's cache and chunk store
connection.py the framed connection and its generations, the hang watchdog
launch.py     connect, else start the engine process
"""
