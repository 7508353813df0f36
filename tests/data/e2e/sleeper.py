"""Prints, then hangs: the lab must kill it at the scenario's timeout and keep what it printed."""
import time

print("started", flush=True)
time.sleep(3600)
