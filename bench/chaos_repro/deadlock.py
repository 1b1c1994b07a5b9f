# A task pipelined onto a worker blocked in ray.get (docs/architecture.md "Path of a task" 4 and 6).
import time, ray
ray.init()

@ray.remote
def fast(x, i):            # short: after warm-up its EWMA is < 2 ms, so pipelined up to 64 deep
    return x + i

@ray.remote
def waiter(refs):          # nested ref: blocks in ray.get (the node lends its CPU out)
    return ray.get(refs[0], timeout=15)

@ray.remote(num_cpus=0.5)  # another resource shape: another lease key
def gate():
    time.sleep(1.0)
    return 100

ray.get([fast.remote(i, 1) for i in range(500)])          # warm-up: fast is now "short"
g = gate.remote()
inner = [fast.remote(g, i) for i in range(4)]              # wait for g (PENDING_ARGS)
outs = [waiter.remote([r]) for r in inner]                 # start now, block on inner
t0 = time.time()
try:
    print("OK", ray.get(outs, timeout=30), f"{time.time() - t0:.1f} s")
except Exception as e:
    print("FAIL", type(e).__name__, str(e).splitlines()[-1], f"{time.time() - t0:.1f} s")
