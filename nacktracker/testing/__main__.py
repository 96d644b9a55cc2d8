"""``python -m nacktracker.testing apache|lite [--set KEY=VALUE ...]``: a test broker for people and scripts.

Starts the broker, prints ``PULSAR_URL=...`` (and ``PULSAR_ADMIN_URL=...`` for
Apache Pulsar) on lines of their own once it is ready, then runs until SIGTERM
or SIGINT, or until the process that started this one dies; then stops the
broker and everything it started. Exit status 1 if the broker cannot start or
dies on its own (its log tail on stderr).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from typing import Optional, Sequence, Union

from . import ApacheBroker, BrokerStartError, EmbeddedBroker


def _setting(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return key.strip(), value.strip()


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m nacktracker.testing", description=__doc__.splitlines()[0])
    parser.add_argument("kind", choices=("apache", "lite"), help="Apache Pulsar standalone, or pulsar-lite")
    parser.add_argument("--set", dest="settings", action="append", type=_setting, default=[], metavar="KEY=VALUE",
                        help="a broker setting (Apache Pulsar only), e.g. defaultNumPartitions=2; repeatable")
    parser.add_argument("--data-dir", help="keep the broker's data here (default: a temporary directory, removed)")
    parser.add_argument("--port", type=int, help="the binary protocol's port (default: a free one)")
    args = parser.parse_args(argv)

    broker: Union[ApacheBroker, EmbeddedBroker]
    if args.kind == "apache":
        broker = ApacheBroker(args.data_dir, settings=dict(args.settings), port=args.port)
    else:
        if args.settings:
            parser.error("--set is for Apache Pulsar; pulsar-lite takes no settings")
        broker = EmbeddedBroker(args.data_dir, port=args.port)

    done = threading.Event()
    starting = True

    def on_signal(*_: object) -> None:
        done.set()
        if starting:  # interrupt a start in progress (Maven, the JVM's start): the finally below cleans up
            raise KeyboardInterrupt

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, on_signal)
    parent = os.getppid()
    try:
        try:
            broker.start()
        except BrokerStartError as error:
            print(error, file=sys.stderr)
            return 1
        except KeyboardInterrupt:
            return 130
        starting = False
        print(f"PULSAR_URL={broker.url}", flush=True)
        if isinstance(broker, ApacheBroker):
            print(f"PULSAR_ADMIN_URL={broker.admin_url}", flush=True)
        while not done.wait(0.5):
            if os.getppid() != parent:
                print("the parent process has gone; stopping the broker", file=sys.stderr)
                break
            if not broker.running:
                print(f"the broker exited on its own; log tail:\n{broker.log_tail()}", file=sys.stderr)
                return 1
        return 0
    finally:
        broker.stop()


if __name__ == "__main__":
    sys.exit(main())
