"""Spilling through Ray's Python API: `ray.init(object_store_memory=..., object_spilling_directory=...)`
starts a private cluster whose store spills values nobody reads to that directory and restores
them on `ray.get`; arrays read zero-copy pin their values, so a store full of pinned values
refuses a Put with a clear error, and accepts it again once they are dropped."""
from helpers import run_python


def test_puts_beyond_the_store_spill_restore_and_pins_hold(tmp_path):
    spill = tmp_path / "spill"
    p = run_python(f"""
        import glob, gc
        import numpy as np
        import ray
        MiB = 1 << 20
        ray.init(num_cpus=2, object_store_memory=64 * MiB, object_spilling_directory={str(spill)!r})
        refs = [ray.put(np.full(16 * MiB, i, dtype=np.uint8)) for i in range(10)]
        files = glob.glob({str(spill)!r} + "/**/*.spill", recursive=True)
        assert len(files) >= 7, files
        for i in reversed(range(10)):
            a = ray.get(refs[i])
            assert a.shape == (16 * MiB,) and int(a[0]) == i and int(a[-1]) == i, (i, a[:4])
            del a

        @ray.remote
        def total(x):
            return int(x.sum(dtype=np.uint64))

        assert ray.get([total.remote(r) for r in refs]) == [16 * MiB * i for i in range(10)]
        # Three arrays held zero-copy pin their values: the 64 MiB store cannot take a fourth.
        held = [ray.get(refs[i]) for i in range(3)]
        try:
            ray.put(np.zeros(16 * MiB, dtype=np.uint8))
            print("PUT-SUCCEEDED")
        except Exception as e:
            print("PUT-REFUSED", type(e).__name__, e)
        del held
        gc.collect()
        r = ray.put(np.ones(16 * MiB, dtype=np.uint8))
        assert int(ray.get(r)[5]) == 1
        del refs, r
        gc.collect()
        import time
        deadline = time.time() + 15
        while glob.glob({str(spill)!r} + "/**/*.spill", recursive=True) and time.time() < deadline:
            time.sleep(0.1)
        print("LEFT", len(glob.glob({str(spill)!r} + "/**/*.spill", recursive=True)))
        ray.shutdown()
    """, shim=True, timeout=300)
    out = p.stdout
    assert "PUT-REFUSED" in out and "in use" in out, out + p.stderr
    assert "LEFT 0" in out, out


def test_system_config_spelling_of_the_spill_directory(tmp_path):
    """Ray's older spelling, _system_config={"object_spilling_config": ...}, names the same
    directory; a non-filesystem type is refused with a clear error."""
    spill = tmp_path / "old-spelling"
    p = run_python(f"""
        import glob, json
        import numpy as np
        import ray
        MiB = 1 << 20
        cfg = {{"type": "filesystem", "params": {{"directory_path": [{str(spill)!r}]}}}}
        try:
            ray.init(num_cpus=1, object_store_memory=64 * MiB,
                     _system_config={{"object_spilling_config": json.dumps({{"type": "smart_open"}})}})
        except NotImplementedError as e:
            print("REFUSED", e)
        ray.init(num_cpus=1, object_store_memory=64 * MiB,
                 _system_config={{"object_spilling_config": json.dumps(cfg)}})
        refs = [ray.put(np.full(16 * MiB, i, dtype=np.uint8)) for i in range(6)]
        print("FILES", len(glob.glob({str(spill)!r} + "/**/*.spill", recursive=True)))
        assert [int(ray.get(r)[7]) for r in refs] == list(range(6))
        ray.shutdown()
    """, shim=True, timeout=300)
    assert "REFUSED" in p.stdout and "filesystem" in p.stdout, p.stdout + p.stderr
    files = int(p.stdout.split("FILES ")[1].split()[0])
    assert files >= 3, p.stdout
