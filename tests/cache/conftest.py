"""S3 as a real HTTP server on loopback (moto in server mode; SeaweedFS, a real S3-compatible
store, for what moto is lenient about), and a cache-ready test setup."""

from __future__ import annotations

import boto3
import pytest
from moto.server import ThreadedMotoServer

from tests.ports import free_port
from tests.s3_server import SeaweedS3, SeaweedUnavailable

BUCKET = "weights"


@pytest.fixture(scope="session")
def s3_endpoint():
    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    yield f"http://127.0.0.1:{port}"
    server.stop()


@pytest.fixture
def s3(s3_endpoint, monkeypatch):
    """A boto3 client on the moto server, a fresh bucket, and the environment the workers'
    boto3 reads (the same variables production sets for any S3-compatible store)."""
    for name, value in {
        "AWS_ENDPOINT_URL_S3": s3_endpoint,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }.items():
        monkeypatch.setenv(name, value)
    client = boto3.client("s3", endpoint_url=s3_endpoint, region_name="us-east-1")
    client.create_bucket(Bucket=BUCKET)
    yield client
    empty_bucket(client)


@pytest.fixture(scope="session")
def seaweed_server(tmp_path_factory):
    """One SeaweedFS S3 gateway (``weed mini``) for the session; about a second to start."""
    try:
        server = SeaweedS3(tmp_path_factory.mktemp("seaweedfs")).start()
    except SeaweedUnavailable as exc:
        pytest.fail(f"SeaweedFS did not start: {exc}")
    yield server
    server.stop()


@pytest.fixture
def seaweed(seaweed_server, monkeypatch):
    """Like ``s3``, on SeaweedFS: a boto3 client, a fresh bucket, the workers' environment."""
    for name, value in seaweed_server.env().items():
        monkeypatch.setenv(name, value)
    client = seaweed_server.client()
    client.create_bucket(Bucket=BUCKET)
    yield client
    empty_bucket(client)


def empty_bucket(client) -> None:
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=BUCKET):
        for obj in page.get("Contents", []):
            client.delete_object(Bucket=BUCKET, Key=obj["Key"])
    client.delete_bucket(Bucket=BUCKET)
