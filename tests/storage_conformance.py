"""Test helpers around the storage conformance suite, which ships in the package
(:mod:`rollout_mock.storage.testing`): re-exports, and a local S3 server for the S3 runs."""

from __future__ import annotations

import socket
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from rollout_mock.storage.testing import MATH, RANK1, TRAIN, BackendConformance, StoreConformance, batch_for, same, save  # noqa: F401

__all__ = ["BackendConformance", "StoreConformance", "batch_for", "s3_server", "same", "save"]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(scope="session")
def s3_server() -> Iterator[dict[str, Any]]:
    """A moto S3 server on 127.0.0.1 (random free port) with one bucket; stopped at the end.

    Yields ``storage_options`` for s3fs (endpoint, dummy credentials, bounded timeouts and
    retries) and the bucket name.
    """
    pytest.importorskip("s3fs")
    moto_server = pytest.importorskip("moto.server")
    port = free_port()
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    endpoint = f"http://127.0.0.1:{port}"
    options = {
        "endpoint_url": endpoint, "key": "testing", "secret": "testing",
        "client_kwargs": {"region_name": "us-east-1"},
        "config_kwargs": {"connect_timeout": 5, "read_timeout": 20, "retries": {"max_attempts": 2}},
        "skip_instance_cache": True,
    }
    bucket = f"rollout-mock-{uuid.uuid4().hex[:8]}"
    try:
        import boto3

        boto3.client("s3", endpoint_url=endpoint, aws_access_key_id="testing", aws_secret_access_key="testing",
                     region_name="us-east-1").create_bucket(Bucket=bucket)
        yield {"storage_options": options, "bucket": bucket, "endpoint": endpoint}
    finally:
        server.stop()
