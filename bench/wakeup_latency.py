"""The machine's wake-up latency, the floor under every synchronous row: two processes bounce one
byte over a pair of pipes; prints the round trip's p50 and p90.

    python3 bench/wakeup_latency.py [--trips N]
"""
import argparse
import os
import time


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--trips", type=int, default=20000)
    n = ap.parse_args().trips
    to_child, from_parent = os.pipe()
    from_child, to_parent = os.pipe()
    pid = os.fork()
    if pid == 0:
        while True:
            b = os.read(to_child, 1)
            if not b or b == b"q":
                os._exit(0)
            os.write(to_parent, b)
    lat = []
    for _ in range(n):
        t = time.perf_counter()
        os.write(from_parent, b"x")
        os.read(from_child, 1)
        lat.append(time.perf_counter() - t)
    os.write(from_parent, b"q")
    os.waitpid(pid, 0)
    lat.sort()
    print(f"pipe ping-pong, {n} round trips: p50 {lat[n // 2] * 1e6:.1f} us, "
          f"p90 {lat[int(n * 0.9)] * 1e6:.1f} us")


if __name__ == "__main__":
    main()
