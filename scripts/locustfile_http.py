"""locust's users for scripts/load_http.py: each loops streaming requests at `rakv serve --http` (completions and a
share of chat completions, prompts from --prompts), cuts a share of them after their first event or two, and logs
every request (its id, whether it was cut, what it saw) to DIR/clients-<pid>.jsonl (rakv.bench.load_client).

Run by scripts/load_http.py as a subprocess (locust patches the process it is imported in):

    locust -f scripts/locustfile_http.py --headless -u 64 -r 16 -t 300s --host http://127.0.0.1:8000 \\
        --prompts prompts.json --log-dir DIR
"""

from __future__ import annotations

import itertools
import json
import os
import random
from pathlib import Path

from gevent import GreenletExit
from locust import HttpUser, between, events, task

from rakv.bench.load_client import ClientLog, Mix, Outcome, read_stream, refused_or_failed

USERS = itertools.count()
LOG: list[ClientLog] = []  # this process's log, opened by the first user


@events.init_command_line_parser.add_listener
def add_arguments(parser):
    parser.add_argument("--prompts", required=True, help="a JSON list of prompts")
    parser.add_argument("--log-dir", required=True, help="where clients-<pid>.jsonl goes")
    parser.add_argument("--cut-share", type=float, default=0.2, help="streams the client cuts after an event or two")
    parser.add_argument("--chat-share", type=float, default=0.2, help="requests sent to /v1/chat/completions")
    parser.add_argument("--max-tokens", type=int, nargs=2, default=[32, 64], help="max_tokens drawn in this range")
    parser.add_argument("--request-timeout-s", type=float, default=600.0)
    parser.add_argument("--seed", type=int, default=0)


class StreamingUser(HttpUser):
    wait_time = between(0.0, 0.5)

    def on_start(self):
        options = self.environment.parsed_options
        self.mix = Mix(json.loads(Path(options.prompts).read_text()), options.chat_share, options.cut_share,
                       tuple(options.max_tokens))
        self.rng = random.Random(options.seed * 1000 + next(USERS))
        self.timeout_s = options.request_timeout_s
        if not LOG:
            LOG.append(ClientLog(Path(options.log_dir) / f"clients-{os.getpid()}.jsonl"))

    @task
    def stream(self):
        ask = self.mix.draw(self.rng)
        seen, response = Outcome(ask.path, ask.cut_after), None
        try:
            with self.client.post(ask.path, json=ask.body, stream=True, catch_response=True, timeout=self.timeout_s,
                                  name=ask.path) as response:
                seen.status = response.status_code
                if response.status_code != 200:
                    refused_or_failed(seen, response.status_code, response.text)
                    response.failure(seen.outcome)
                    return
                read_stream(response.iter_lines(chunk_size=None, decode_unicode=True), seen)
                response.close()  # a cut stream: the connection goes, and the server should abort the request
                if seen.outcome in ("finished", "cut"):
                    response.success()
                else:
                    response.failure(seen.error or seen.outcome)
        except GreenletExit:  # locust stops its users mid-request when the run ends
            seen.end("stopped")
            if response is not None:
                response.close()
            raise
        except Exception as exc:  # noqa: BLE001 - every failure is one line of the log, the user goes on
            seen.end("client-error", f"{type(exc).__name__}: {exc}")
        finally:
            LOG[0].write(seen)
