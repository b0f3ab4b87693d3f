"""`GET /metrics` of `rakv serve --http`: Prometheus metrics under vLLM's names, so a dashboard built for vLLM reads
this server unchanged.

Per request, counted when it leaves the engine (rakv.serving.records.RequestRecord): prompt and generated tokens,
successes by finish reason, TTFT / inter-token / end-to-end / queue-time histograms, the prefix cache's queries and
hits (in tokens, as vLLM's), speculative decoding's drafts, draft tokens and accepted tokens. Per iteration: the
running and waiting requests and the K/V cache's usage. vLLM counts drafts per step; here they are counted when the
request ends (the totals agree once it has). Preemptions (`vllm:num_preemptions`) are counted per request as it
ends. Metrics of this server alone are `rakv:` ones: what the controller chose per finished request (its action's
reuse, proposer and k: `rakv:request_actions`, `rakv:request_k`), its predicted latency against the measured one
(`rakv:predicted_service_seconds`, `rakv:measured_service_seconds` and their ratio, `rakv:service_prediction_ratio`),
the K/V bytes held, requests refused / aborted / failed, failed iterations, whether the engine runs. Each server has
its own registry; docs/grafana/rakv.json is a dashboard of these (tests/test_http_fields.py checks its queries).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from rakv.serving.records import RequestRecord

# vLLM's buckets (vllm/v1/metrics/loggers.py)
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
                40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0,
               80.0)
E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0,
               960.0, 1920.0, 7680.0)
K_BUCKETS = (0, 1, 2, 3, 4, 6, 8, 12, 16)
RATIO_BUCKETS = (0.25, 0.5, 0.67, 0.8, 0.9, 1.0, 1.1, 1.25, 1.5, 2.0, 4.0)
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class ServerMetrics:
    """The metrics of one server; `observe_request` from the engine thread as a request leaves, `observe_load` after
    each iteration (prometheus_client's metrics are thread-safe)."""

    def __init__(self, model_name: str, proposer: str = "draft"):
        self.registry = registry = CollectorRegistry()
        label = ("model_name",)

        def counter(name, text, labels=label):
            return Counter(name, text, labels, registry=registry)

        def gauge(name, text):
            return Gauge(name, text, label, registry=registry).labels(model_name)

        def histogram(name, text, buckets):
            return Histogram(name, text, label, buckets=buckets, registry=registry).labels(model_name)

        self.model_name, self.proposer = model_name, proposer
        self.preemptions = counter("vllm:num_preemptions", "Cumulative preemptions (K/V dropped, recomputed later)"
                                   ).labels(model_name)
        self.actions = counter("rakv:request_actions", "Finished requests by the action chosen for them: prefix reuse, "
                               "proposer (none without speculation) and k", ("model_name", "reuse", "proposer", "k"))
        self.k = histogram("rakv:request_k", "Candidates per round chosen for finished requests", K_BUCKETS)
        self.predicted = histogram("rakv:predicted_service_seconds", "The cost model's predicted service time of "
                                   "finished requests (under the load admitted into, else alone)", E2E_BUCKETS)
        self.measured = histogram("rakv:measured_service_seconds", "Admission to last token of finished requests",
                                  E2E_BUCKETS)
        self.prediction_ratio = histogram("rakv:service_prediction_ratio", "Measured over predicted service time",
                                          RATIO_BUCKETS)
        self.running = gauge("vllm:num_requests_running", "Requests in the running batch")
        self.waiting = gauge("vllm:num_requests_waiting", "Requests waiting to be admitted")
        self.kv_usage = gauge("vllm:kv_cache_usage_perc", "K/V held by running requests over the K/V budget (0-1)")
        self.kv_bytes = gauge("rakv:kv_bytes", "K/V bytes held by running requests")
        self.engine_alive = gauge("rakv:engine_alive", "1 while the engine thread runs, 0 once it has stopped")
        self.prompt_tokens = counter("vllm:prompt_tokens", "Prompt tokens of finished requests").labels(model_name)
        self.generation_tokens = counter("vllm:generation_tokens", "Generated tokens of finished requests"
                                         ).labels(model_name)
        self.success = counter("vllm:request_success", "Finished requests by finish reason",
                               ("model_name", "finished_reason"))
        self.ended = counter("rakv:requests_ended", "Requests that did not finish: refused, aborted or failed",
                             ("model_name", "status"))
        self.failed_iterations = counter("rakv:failed_iterations", "Iterations whose shared part raised"
                                         ).labels(model_name)
        self.prefix_queries = counter("vllm:prefix_cache_queries", "Prompt tokens looked up in the prefix store"
                                      ).labels(model_name)
        self.prefix_hits = counter("vllm:prefix_cache_hits", "Prompt tokens found in the prefix store"
                                   ).labels(model_name)
        self.drafts = counter("vllm:spec_decode_num_drafts", "Speculative rounds that offered candidates"
                              ).labels(model_name)
        self.draft_tokens = counter("vllm:spec_decode_num_draft_tokens", "Candidates verified").labels(model_name)
        self.accepted_tokens = counter("vllm:spec_decode_num_accepted_tokens", "Candidates accepted"
                                       ).labels(model_name)
        self.ttft = histogram("vllm:time_to_first_token_seconds", "Arrival to first token", TTFT_BUCKETS)
        self.itl = histogram("vllm:inter_token_latency_seconds", "Gaps between successive emissions", ITL_BUCKETS)
        self.e2e = histogram("vllm:e2e_request_latency_seconds", "Arrival to last token", E2E_BUCKETS)
        self.queue_time = histogram("vllm:request_queue_time_seconds", "Arrival to admission", E2E_BUCKETS)
        self.engine_alive.set(1)

    def observe_request(self, record: RequestRecord, finish_reason: str | None) -> None:
        """A request left the engine: finished (with its finish reason: stop or length) or not (refused, aborted,
        failed)."""
        self.preemptions.inc(record.preempted)
        if not record.ok:
            self.ended.labels(self.model_name, record.status).inc()
            return
        self.actions.labels(self.model_name, str(record.reuse).lower(), self.proposer if record.k else "none",
                            str(record.k)).inc()
        self.k.observe(record.k)
        predicted = record.served_predicted_s if record.served_predicted_s is not None else record.predicted_s
        if predicted is not None:
            self.predicted.observe(predicted)
        if record.service_s is not None:
            self.measured.observe(record.service_s)
            if predicted:
                self.prediction_ratio.observe(record.service_s / predicted)
        self.success.labels(self.model_name, finish_reason or "length").inc()
        self.prompt_tokens.inc(record.prompt_tokens)
        self.generation_tokens.inc(record.new_tokens)
        self.prefix_queries.inc(record.prompt_tokens)
        self.prefix_hits.inc(record.hit_tokens)
        self.drafts.inc(record.rounds - record.empty_rounds)
        self.draft_tokens.inc(record.proposed)
        self.accepted_tokens.inc(record.accepted)
        if record.ttft_s is not None:
            self.ttft.observe(record.ttft_s)
        for gap in record.itl_s:
            self.itl.observe(gap)
        if record.e2el_s is not None:
            self.e2e.observe(record.e2el_s)
        if record.admitted_s is not None:
            self.queue_time.observe(max(0.0, record.admitted_s - record.arrival_s))

    def observe_load(self, running: int, waiting: int, kv_bytes: int, kv_budget_bytes: int) -> None:
        self.running.set(running)
        self.waiting.set(waiting)
        self.kv_bytes.set(kv_bytes)
        self.kv_usage.set(kv_bytes / kv_budget_bytes if kv_budget_bytes else 0.0)

    def render(self) -> bytes:
        return generate_latest(self.registry)
