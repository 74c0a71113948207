# Put on PYTHONPATH (as sitecustomize.py) to log every full (generation 2) collection of every Python process
# started with that environment, one file per process in /tmp/gchook: when, how long, objects tracked after.
import gc, os, sys, time
_t = [0.0]
_log = open(f"/tmp/gchook/gc_{os.getpid()}.log", "a", buffering=1)
_log.write("argv " + " ".join(sys.argv[:3]) + "\n")
def _cb(phase, info):
    if phase == "start":
        _t[0] = time.perf_counter()
    elif info["generation"] == 2:
        _log.write(f"{time.time():.3f} gen2 {1e3*(time.perf_counter()-_t[0]):.1f} ms tracked_after={len(gc.get_objects())}\n")
gc.callbacks.append(_cb)
