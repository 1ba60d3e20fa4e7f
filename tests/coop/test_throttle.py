"""coop.throttle: the rates and delays parse as written, and transfers really take the time a link
of that rate and latency would (both directions, shared between threads)."""
import threading
import time

import httpx
import pytest

from coop.throttle import LinkLimits, ThrottledTransport, TokenBucket, parse_latency, parse_rate


@pytest.mark.parametrize("text, bytes_per_s", [("100Mbit", 12.5e6), ("1Gbit", 125e6), ("500kbit", 62.5e3),
                                               ("10MB", 10e6), ("250kB", 250e3), ("8bit", 1.0),
                                               ("1.5Gbit/s", 187.5e6), ("100Mbps", 12.5e6), ("2MB/s", 2e6)])
def test_rates_parse_in_decimal_units_bits_or_bytes(text, bytes_per_s):
    assert parse_rate(text) == pytest.approx(bytes_per_s)


@pytest.mark.parametrize("text, seconds", [("50ms", 0.05), ("0.2s", 0.2), ("200us", 2e-4), ("1", 1.0)])
def test_latencies_parse(text, seconds):
    assert parse_latency(text) == pytest.approx(seconds)


@pytest.mark.parametrize("bad", ["fast", "100", "-1Mbit", "0Mbit", "10 Xbit", "", "10Mb"])
def test_bad_rates_say_what_is_expected(bad):
    with pytest.raises(ValueError, match="--limit-rate"):
        parse_rate(bad)


def test_bad_latency_says_what_is_expected():
    with pytest.raises(ValueError, match="--latency"):
        parse_latency("soon")
    assert LinkLimits.parse(None, None) is None
    assert LinkLimits.parse("8Mbit", "10ms").describe() == "8 Mbit/s each way, 10 ms latency"


def client(limits: LinkLimits, payload: bytes) -> httpx.Client:
    def handler(request: httpx.Request) -> httpx.Response:
        body = b"".join(request.stream)  # the upload, paced as the server reads it
        reply = payload if request.method == "GET" else str(len(body)).encode()
        return httpx.Response(200, stream=httpx.ByteStream(reply))  # a stream: paced as the client reads it
    return httpx.Client(transport=ThrottledTransport(limits, httpx.MockTransport(handler)), base_url="http://x")


def test_an_upload_and_a_download_take_as_long_as_the_rate_says():
    size, rate = 300_000, parse_rate("2.4Mbit")  # 300 kB/s: a second each way
    with client(LinkLimits(rate), b"d" * size) as http:
        start = time.perf_counter()
        assert http.put("/up", content=b"u" * size).text == str(size)
        up = time.perf_counter() - start
        start = time.perf_counter()
        assert len(http.get("/down").content) == size
        down = time.perf_counter() - start
    burst = max(16 << 10, rate / 20) / rate  # the bucket starts full
    for seconds in (up, down):
        assert 1.0 - burst - 0.05 <= seconds < 2.0, (up, down)


def test_concurrent_transfers_share_the_link():
    size, rate = 100_000, 400_000.0  # together 400 kB at 400 kB/s: about a second
    with client(LinkLimits(rate), b"") as http:
        threads = [threading.Thread(target=http.put, args=("/up",), kwargs={"content": b"u" * size})
                   for _ in range(4)]
        start = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert 0.85 <= time.perf_counter() - start < 2.0


def test_latency_is_paid_before_the_request_and_before_the_response():
    with client(LinkLimits(None, 0.05), b"ok") as http:
        start = time.perf_counter()
        for _ in range(4):
            assert http.get("/").content == b"ok"
        assert time.perf_counter() - start >= 4 * 2 * 0.05


def test_a_token_bucket_never_runs_ahead_of_its_rate():
    bucket = TokenBucket(1e6, burst=1000)
    start = time.perf_counter()
    for _ in range(200):
        bucket.take(1000)  # 200 kB at 1 MB/s
    assert time.perf_counter() - start >= 0.19
