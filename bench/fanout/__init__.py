"""The fan-out benchmark's client side, standard library only: bench/http_fanout.py and the
device capacity run (bench/capacity/load.py, which must not import the harness) share it."""
