"""A process of a two-process run lost (SIGKILL, SIGSTOP; either process): the survivor stops within
distributed.peer_timeout_seconds + 30 s with one `error:` line naming the process lost,
exit status 75 and no crash dump; the same command on both then resumes to the
final.npz an uninterrupted pair writes, bit for bit. A store outage only one process sees stops
both with 75. Real processes on loopback (test_multihost.py's), a short peer timeout so
that each test takes about a minute."""

import os
import re
import signal
import time

import pytest
from helpers import assert_trees_equal, flat, needs_embedded_data
from test_multihost import RUN, finish_pair, launch_pair
from test_resume import complete_steps, partial_saves

from vit_jax import weights

PEER_TIMEOUT = 10
PAIR = {**RUN, "checkpoint_every": 4, "distributed.peer_timeout_seconds": PEER_TIMEOUT}
CRASH = re.compile(r"Extension modules|Fatal Python error|Check failure stack trace")


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The final.npz of an uninterrupted pair, and the compilation cache the tests share."""
    root = tmp_path_factory.mktemp("reference")
    cache = {"JAX_COMPILATION_CACHE_DIR": str(root / "jax_cache")}
    finish_pair(launch_pair(str(root / "pair"), cache, overrides=PAIR))
    return flat(weights.load_npz(root / "pair" / "final.npz")), cache


def lose_one(workdir, cache, victim: int, how: signal.Signals) -> tuple[int, str, float]:
    """Starts a pair, sends `how` to process `victim` once process 0 logged step 6; the
    survivor's status, its output and the seconds from the signal to its exit."""
    runs = launch_pair(workdir, cache, overrides=PAIR)
    survivor = runs[1 - victim]
    try:
        runs[0].wait_for(lambda line: line.startswith("step 6/8"), timeout=300)
        os.kill(runs[victim].proc.pid, how)
        sent = time.monotonic()
        status = survivor.finish(timeout=PEER_TIMEOUT + 120)
        return status, "\n".join(survivor.log), time.monotonic() - sent
    finally:
        for run in runs:
            run.kill()


# JAX's service now and then aborts process 0 first (distributed._judge then says it)
LOST_WORKER = (
    r"lost process 1 of 2: (no heartbeat for 10 s \(distributed\.peer_timeout_seconds\)"
    r"|JAX's distributed runtime stopped this process)"
)
LOST_COORDINATOR = r"lost process 0 of 2 \(the coordinator\): JAX's distributed runtime .*"
PYTHON_CRASH = re.compile(r"Extension modules|Fatal Python error")


@pytest.mark.slow
@needs_embedded_data
@pytest.mark.parametrize(
    "victim, how, said",
    [
        pytest.param(1, signal.SIGKILL, LOST_WORKER, id="worker-killed"),
        # the same watcher's timeout as worker-killed: CI leaves it out for its time
        pytest.param(1, signal.SIGSTOP, LOST_WORKER, id="worker-frozen", marks=pytest.mark.long),
        pytest.param(0, signal.SIGKILL, LOST_COORDINATOR, id="coordinator-killed"),
        pytest.param(0, signal.SIGSTOP, LOST_COORDINATOR, id="coordinator-frozen"),
    ],
)
def test_the_survivor_of_a_lost_process_exits_75_and_the_pair_resumes(
    tmp_path, reference, victim, how, said
):
    want, cache = reference
    workdir = str(tmp_path / "pair")
    status, log, seconds = lose_one(workdir, cache, victim, how)
    print(f"process {victim} {how.name}: the other exited {status} after {seconds:.1f} s")
    assert status == 75, log
    # a frozen coordinator: JAX's heartbeat timeout (PEER_TIMEOUT + 30), then the judge's read
    bound = PEER_TIMEOUT + 30 + (15 if (victim, how) == (0, signal.SIGSTOP) else 0)
    assert seconds < bound, (seconds, log)
    last = log.splitlines()[-1]
    rerun = r"; run the same command on every host: .* \(exit status 75\)"
    assert re.fullmatch(f"error: {said}{rerun}", last), log
    assert sum(line.startswith("error:") for line in log.splitlines()) == 1, log
    # JAX's client logs its own fatal error before it aborts when process 0 is gone.
    assert not (CRASH if victim else PYTHON_CRASH).search(log), log
    logs = finish_pair(launch_pair(workdir, cache, overrides=PAIR))
    assert "resuming from step 4 " in logs[0] and "step 8/8" in logs[0], logs[0]
    assert_trees_equal(flat(weights.load_npz(f"{workdir}/final.npz")), want)


@pytest.mark.slow
@needs_embedded_data
def test_a_worker_killed_during_a_save_leaves_no_step_that_counts(tmp_path, reference):
    """Process 1 killed while step 4's save is being written (its directory there, Orbax's
    commit file not): process 0 exits 75 within the bound, the step never counts as
    complete, and the same command resumes without a manual step to the reference."""
    want, cache = reference
    workdir, tries = str(tmp_path / "pair"), 0
    while True:  # a save that completes in the microseconds before the kill: again
        tries += 1
        runs = launch_pair(workdir, cache, overrides=PAIR)
        try:
            runs[0].wait_for(lambda line: line.startswith("step 1/8"), timeout=300)
            runs[0].wait_until(lambda: partial_saves(workdir))
            os.kill(runs[1].proc.pid, signal.SIGKILL)
            sent, writing = time.monotonic(), partial_saves(workdir)
            status = runs[0].finish(timeout=PEER_TIMEOUT + 120)
            seconds, log = time.monotonic() - sent, "\n".join(runs[0].log)
        finally:
            for run in runs:
                run.kill()
        complete = {str(step) for step in complete_steps(workdir)}
        if not writing & complete or tries == 3:
            break
    assert not writing & complete, (writing, complete)  # the interrupted save never counts
    assert status == 75 and seconds < PEER_TIMEOUT + 30, (status, seconds, log)
    assert re.search(f"^error: {LOST_WORKER}", log.splitlines()[-1]), log
    assert not CRASH.search(log), log
    logs = finish_pair(launch_pair(workdir, cache, overrides=PAIR))  # no manual step first
    resumed = re.search(r"resuming from step (\d+) ", logs[0])
    assert resumed is None or resumed[1] not in writing, logs[0]  # a complete step, or none
    assert "step 8/8" in logs[0], logs[0]
    assert_trees_equal(flat(weights.load_npz(f"{workdir}/final.npz")), want)


@pytest.mark.slow
@needs_embedded_data
def test_an_outage_only_one_process_sees_stops_both_with_75(tmp_path, reference):
    """Process 1 reaches the bucket through a relay that goes down, process 0 straight:
    process 1 gives up after store.retry_seconds, and process 0 follows it with 75."""
    pytest.importorskip("gcp_storage_emulator", reason="gcp-storage-emulator")
    import gcs_emulator
    from relay import Relay
    from subprocesses import Run, tiny_flags
    from test_multihost import free_port

    _, cache = reference
    port = free_port()
    server, relay, runs = gcs_emulator.serve(port, "bkt"), None, []
    try:
        relay = Relay(port)
        address, window = f"127.0.0.1:{free_port()}", 15
        for i, store_port in enumerate([port, relay.port]):
            flags = tiny_flags("gs://bkt/pair", **PAIR, **{"store.retry_seconds": window})
            flags += [
                f"--config.distributed.coordinator_address={address}",
                "--config.distributed.num_processes=2",
                f"--config.distributed.process_id={i}",
            ]
            runs.append(Run(flags, 4, {**cache, **gcs_emulator.env(store_port)}))
        runs[0].wait_for(lambda line: line.startswith("step 6/8"), timeout=300)
        relay.down()
        statuses = [run.finish(timeout=window + 120) for run in runs]
    finally:
        for run in runs:
            run.kill()
        if relay is not None:
            relay.close()
        server.kill()
        server.wait()
    assert statuses == [75, 75], [run.tail() for run in runs]
    last = [run.log[-1] for run in runs]
    assert last[0].startswith("error: process 1 of 2 gave up on the store; "), runs[0].tail()
    assert last[1].startswith("error: the store at gs://bkt/pair did not answer"), runs[1].tail()
    for run in runs:
        assert sum(line.startswith("error:") for line in run.log) == 1, run.tail()
        assert not CRASH.search("\n".join(run.log)), run.tail()


@pytest.mark.slow
@pytest.mark.long
@needs_embedded_data
def test_in_a_pod_of_four_every_survivor_exits_75_and_the_rerun_is_bit_identical(
    tmp_path, reference
):
    """Four processes of two devices each (the pair's 8 devices), process 2 killed at
    step 6: processes 0, 1 and 3 each exit 75 with one line naming process 2 of 4, within
    the bound; the same command on all four resumes to the pair's final.npz, bit for bit."""
    want, cache = reference
    workdir = str(tmp_path / "pod")
    runs = launch_pair(workdir, cache, overrides=PAIR, processes=4)
    try:
        runs[0].wait_for(lambda line: line.startswith("step 6/8"), timeout=300)
        os.kill(runs[2].proc.pid, signal.SIGKILL)
        sent = time.monotonic()
        survivors = [runs[i] for i in (0, 1, 3)]
        statuses = [run.finish(timeout=PEER_TIMEOUT + 120) for run in survivors]
        seconds = time.monotonic() - sent
    finally:
        for run in runs:
            run.kill()
    print(f"process 2 of 4 killed: the last survivor exited after {seconds:.1f} s")
    assert statuses == [75, 75, 75], [run.tail() for run in survivors]
    assert seconds < PEER_TIMEOUT + 30, seconds
    lost = r"error: lost process 2 of 4: (no heartbeat for 10 s|JAX's distributed runtime)"
    for run in survivors:
        assert re.match(lost, run.log[-1]), run.tail()
        assert sum(line.startswith("error:") for line in run.log) == 1, run.tail()
        assert not CRASH.search("\n".join(run.log)), run.tail()
    logs = finish_pair(launch_pair(workdir, cache, overrides=PAIR, processes=4))
    assert "resuming from step 4 " in logs[0] and "step 8/8" in logs[0], logs[0]
    assert_trees_equal(flat(weights.load_npz(f"{workdir}/final.npz")), want)
