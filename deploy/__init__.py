"""How the platform runs: settings and the data dir at the top, then its rooms: cli/, supervision/, runtime/, scheduling/, demo/."""
