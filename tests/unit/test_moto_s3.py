"""The suite's S3 endpoint runs moto's object puts and deletes under one lock (devtools/moto_s3.py)."""

from __future__ import annotations

import threading

from airflow_provider_speculative.devtools import moto_s3


def test_puts_and_deletes_wait_for_the_lock_and_patching_twice_wraps_once() -> None:
    from moto.s3.responses import S3Response

    moto_s3.patch()
    moto_s3.patch()
    for name in ("put_object", "delete_object"):
        method = getattr(S3Response, name)
        assert method._speculative_serialized and not getattr(method.__wrapped__, "_speculative_serialized", False)
        entered = threading.Event()

        def call(method=method, entered=entered) -> None:
            try:
                method(object())  # not a real request: it fails once it gets past the lock
            except Exception:
                pass
            entered.set()

        with moto_s3._LOCK:
            thread = threading.Thread(target=call)
            thread.start()
            assert not entered.wait(0.3), f"{name} ran while another request held the lock"
        assert entered.wait(10), f"{name} never ran after the lock was released"
        thread.join()
