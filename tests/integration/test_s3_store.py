"""The store conformance suite, plus what only object stores need, against a real
S3-compatible server: moto's ThreadedMotoServer on 127.0.0.1 (HTTP, random free port)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import HANG_S
from storage_conformance import (  # noqa: F401
    TRAIN,
    BackendConformance,
    StoreConformance,
    batch_for,
    free_port,
    s3_server,
    same,
    save,
)

from rollout_mock import LockedError, MockScheduler, open_dump
from rollout_mock.cli import main as cli_main
from rollout_mock.storage import FsspecBackend, FsspecStore

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def url(s3_server: dict[str, Any]) -> str:
    return f"s3://{s3_server['bucket']}/{uuid.uuid4().hex[:10]}"


class TestS3Store(BackendConformance, StoreConformance):
    @pytest.fixture
    def backends(self, url: str, s3_server: dict[str, Any]) -> Any:
        return lambda: FsspecBackend(url, storage_options=s3_server["storage_options"])


class TestS3StoreMultipart(BackendConformance, StoreConformance):
    """Parts of 5 MiB (S3's minimum): steps above that go up as real multipart uploads."""

    @pytest.fixture
    def backends(self, url: str, s3_server: dict[str, Any]) -> Any:
        return lambda: FsspecBackend(url, storage_options=s3_server["storage_options"], part_size=5 << 20)


def test_conditional_put_is_real(url: str, s3_server: dict[str, Any]) -> None:
    """The entry commit is an If-None-Match put the server enforces (not a client-side check)."""
    store = FsspecStore(url, storage_options=s3_server["storage_options"])
    assert store.backend.native_create
    assert store.backend.create("x/probe.json", b"1") and not store.backend.create("x/probe.json", b"2")
    assert store.backend.read("x/probe.json") == b"1"


class _Later:
    """The ``time`` module as the lease code sees it once ``ahead`` seconds have passed: expiry is
    tested by moving the clock, not by sleeping (no wall-clock race on a busy machine)."""

    def __init__(self, ahead: float) -> None:
        self.ahead, self.monotonic, self.sleep = ahead, time.monotonic, time.sleep

    def time(self) -> float:
        return time.time() + self.ahead


def test_expired_lease_is_taken_over_and_the_old_writer_stops(url: str, s3_server: dict[str, Any],
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    from rollout_mock.storage import backend as backend_module

    options = s3_server["storage_options"]
    ttl = float(HANG_S)  # the lease cannot expire on its own during the test, however slow the server
    dead = FsspecStore(url, storage_options=options, lease_ttl=ttl)
    save(dead, TRAIN, 0)
    handle = dead._owned[TRAIN.key].handle
    handle._stop.set()  # the writer hangs: no more heartbeats
    handle._thread.join(timeout=HANG_S)
    with pytest.raises(LockedError, match="expires in"):
        FsspecStore(url, storage_options=options).open_writer(TRAIN)
    monkeypatch.setattr(backend_module, "time", _Later(ttl + 1))  # the lease's time runs out
    successor = FsspecStore(url, storage_options=options, lease_ttl=ttl)
    save(successor, TRAIN, 1)
    current = json.loads(dead.backend.read(f"{TRAIN.directory}/.writer.lock") or b"{}")
    assert current["owner"] == successor._owned[TRAIN.key].handle.owner != handle.owner
    # the old writer wakes up: its next heartbeat finds the lease taken, and it stops writing
    assert handle.renew() is False and "taken over" in (handle.lost or "")
    with pytest.raises(LockedError, match="lost the writer lock"):
        save(dead, TRAIN, 2)
    dead.close()  # does not compact or release what is no longer its own
    successor.close()
    assert open_dump(url, storage_options=options).steps(TRAIN) == [0, 1]


def test_dump_mock_and_cli_on_s3(url: str, s3_server: dict[str, Any], capsys: pytest.CaptureFixture[str],
                                 monkeypatch: pytest.MonkeyPatch) -> None:
    options = s3_server["storage_options"]

    class Scheduler:
        def get_batch(self, data: Any, global_step: int) -> dict[str, Any]:
            return batch_for(global_step)

    config = {"enable": True, "mode": "dump", "dump_dir": url, "storage_options": options, "max_keep": 3}
    with MockScheduler(Scheduler(), config) as sched:
        for step in range(5):
            sched.get_batch(None, global_step=step)
    assert open_dump(url, storage_options=options).steps(TRAIN) == [2, 3, 4]  # retention on S3
    with MockScheduler(None, {**config, "mode": "mock", "max_keep": None}) as mock:
        for step in (2, 3, 4):
            assert same(mock.get_batch(None, global_step=step), batch_for(step))
    # the CLI takes the URL; s3fs reads the endpoint and credentials from the environment
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_server["endpoint"])
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    assert cli_main(["ls", url]) == 0
    out = capsys.readouterr().out
    assert "train: steps 2-4 (3 files" in out
    assert cli_main(["diff", url, url, "--quick"]) == 0


KILLED_WRITER = textwrap.dedent(
    r'''
    import json, os, sys, torch
    import s3fs.core
    from rollout_mock.storage import BatchInfo, FsspecBackend, Store
    from rollout_mock.storage.manifest import StreamId
    url, options, multipart = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3] == "multipart"
    # multipart: parts of 5 MiB, so the 12 MB step is a multipart upload killed after its first part
    store = Store(FsspecBackend(url, storage_options=options, part_size=(5 << 20) if multipart else (16 << 20)))
    stream = StreamId("train")
    big = {"x": torch.zeros(3_000_000)}  # 12 MB
    store.save(stream, 0, {"x": torch.ones(4)}, BatchInfo.of({"x": torch.ones(4)}))
    original_put, original_part = store.backend.fs.pipe_file, s3fs.core.S3File._upload_chunk
    def upload(path, data, **kw):
        if path.endswith("step_000001.pkl"):
            print("UPLOADING", flush=True)
            os.kill(os.getpid(), 9)  # die during the put: the object never completes
        return original_put(path, data, **kw)
    parts = []
    def upload_part(self, final=False):
        parts.append(final)
        if len(parts) == 2:
            print("UPLOADING", flush=True)
            os.kill(os.getpid(), 9)  # one part is up, the upload is not completed
        return original_part(self, final)
    store.backend.fs.pipe_file = upload
    s3fs.core.S3File._upload_chunk = upload_part
    store.save(stream, 1, big, BatchInfo.of(big))
    '''
)


@pytest.mark.parametrize("upload", ["put", "multipart"])
def test_writer_killed_mid_upload_leaves_no_step(url: str, s3_server: dict[str, Any], tmp_path: Path,
                                                 upload: str) -> None:
    script = tmp_path / "writer.py"
    script.write_text(KILLED_WRITER)
    options = dict(s3_server["storage_options"])
    proc = subprocess.run([sys.executable, str(script), url, json.dumps(options), upload], capture_output=True,
                          text=True, timeout=HANG_S)
    assert proc.returncode == -9 and "UPLOADING" in proc.stdout, proc.stderr[-3000:]
    dump = open_dump(url, storage_options=options)
    assert dump.steps(TRAIN) == [0]
    assert torch.equal(dump.load(0, "train")["x"], torch.ones(4))
    # the dead writer's lease blocks a new writer until it expires (60 s by default) ...
    with pytest.raises(LockedError):
        FsspecStore(url, storage_options=options).open_writer(TRAIN)


class _Returns:
    def get_batch(self, data: Any, global_step: int) -> Any:
        return {"x": torch.ones(2)}


def test_a_missing_bucket_is_one_error_naming_it(s3_server: dict[str, Any]) -> None:
    """Issue 30 item 4: not botocore's error, but ours, with the fix."""
    from rollout_mock.errors import DumpNotWritableError

    url = f"s3://no-such-bucket-{uuid.uuid4().hex[:8]}/run"
    with pytest.raises(DumpNotWritableError, match=r"cannot write the dump at s3://no-such-bucket-.*its bucket "
                                                   r"does not exist .*Create the bucket, or fix the URL") as info:
        MockScheduler(_Returns(), {"enable": True, "mode": "dump", "dump_dir": url,
                                  "storage_options": s3_server["storage_options"]})
    assert "\n" not in str(info.value) and info.value.__suppress_context__


READ_ONLY_CREDENTIALS = textwrap.dedent(
    '''
    import json, os, socket
    os.environ["INITIAL_NO_AUTH_ACTION_COUNT"] = "4"  # moto checks credentials after the 4 setup calls
    import boto3
    from moto.server import ThreadedMotoServer
    sock = socket.socket(); sock.bind(("127.0.0.1", 0)); port = sock.getsockname()[1]; sock.close()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    endpoint = f"http://127.0.0.1:{port}"
    admin = dict(endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="x")
    boto3.client("s3", **admin).create_bucket(Bucket="runs")
    iam = boto3.client("iam", **admin)
    iam.create_user(UserName="reader")
    iam.put_user_policy(UserName="reader", PolicyName="read-only", PolicyDocument=json.dumps({
        "Version": "2012-10-17",
        "Statement": [{"Effect": "Allow", "Action": ["s3:GetObject", "s3:ListBucket"], "Resource": "*"}]}))
    key = iam.create_access_key(UserName="reader")["AccessKey"]
    import torch
    from rollout_mock import MockScheduler
    from rollout_mock.errors import RolloutMockError
    class S:
        def get_batch(self, data, global_step):
            return {"x": torch.ones(2)}
    options = {"endpoint_url": endpoint, "key": key["AccessKeyId"], "secret": key["SecretAccessKey"],
               "client_kwargs": {"region_name": "us-east-1"}, "skip_instance_cache": True,
               "config_kwargs": {"retries": {"max_attempts": 1}}}
    try:
        MockScheduler(S(), {"enable": True, "mode": "dump", "dump_dir": "s3://runs/exp1", "storage_options": options})
    except RolloutMockError as exc:
        print(json.dumps({"type": type(exc).__name__, "message": str(exc), "chained": not exc.__suppress_context__}))
    finally:
        server.stop()
    '''
)


def test_read_only_credentials_are_one_error_with_the_fix(tmp_path: Path) -> None:
    """moto enforcing IAM (in a child: the setting is process-wide): the user may read, not write."""
    pytest.importorskip("moto.server")
    script = tmp_path / "read_only.py"
    script.write_text(READ_ONLY_CREDENTIALS)
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=HANG_S)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["type"] == "DumpNotWritableError" and not result["chained"], result
    assert result["message"].startswith("[RolloutMock] cannot write the dump at s3://runs/exp1 while opening train")
    assert "access denied" in result["message"] and "credentials" in result["message"], result


# An S3 server that authenticates every request (moto: INITIAL_NO_AUTH_ACTION_COUNT=0), so that
# credentials it does not know are refused with 403, as AWS refuses wrong or denied ones.
_AUTHENTICATING = """
import sys
from moto.server import ThreadedMotoServer
server = ThreadedMotoServer(ip_address="127.0.0.1", port=int(sys.argv[1]), verbose=False)
server.start()
print("up", flush=True)
sys.stdin.read()  # until the test closes stdin
server.stop()
"""


def test_denied_credentials_give_one_line_naming_the_bucket_the_operation_and_the_fix(tmp_path: Path) -> None:
    """It printed "rollout-mock ls: error: Forbidden" after botocore's INFO lines."""
    pytest.importorskip("moto.server")
    port = free_port()
    server = subprocess.Popen([sys.executable, "-c", _AUTHENTICATING, str(port)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                              env={**os.environ, "INITIAL_NO_AUTH_ACTION_COUNT": "0"})
    try:
        assert server.stdout is not None and server.stdout.readline().strip() == "up"
        env = {**os.environ, "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}", "AWS_ACCESS_KEY_ID": "not-a-key",
               "AWS_SECRET_ACCESS_KEY": "not-a-secret", "AWS_DEFAULT_REGION": "us-east-1", "PYTHONPATH": str(REPO)}
        env.pop("AWS_PROFILE", None)
        done = subprocess.run([sys.executable, "-m", "rollout_mock", "ls", "s3://team-bucket/runs/run1"], env=env,
                              capture_output=True, text=True, timeout=HANG_S, cwd=tmp_path)
    finally:
        server.communicate(input="", timeout=HANG_S)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr  # no botocore "Found credentials in environment variables."
    assert lines[0].startswith("rollout-mock ls: error: access denied by s3://team-bucket (Forbidden) to read "
                               "s3://team-bucket/runs/run1/"), lines[0]
    assert "check the credentials" in lines[0] and "bucket policy" in lines[0]
