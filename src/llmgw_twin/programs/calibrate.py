"""`llmgw-twin calibrate`: fit the engine model's coefficients to a running engine, and say how
well the fitted model predicts a load it was not fitted on.

It drives any OpenAI-compatible server (llama.cpp's `llama-server`, vLLM, SGLang, the sim engine)
through streamed chat completions, timing each request's first token and its end:

1. lone requests with prompts of several lengths (time to first token: one prefill);
2. batches of several concurrencies (time between tokens: one decode step of that batch);
3. a held-out load: seeded Poisson arrivals with prompt and answer lengths drawn at random.

The first two are fitted (`calibrate_fit.fit`); the third is replayed through the fitted model
(`calibrate_fit.predict`) and the TTFT and end-to-end p50 and p99 compared with what was
measured. The report gives an `engines/perf/table.py` entry to paste, and the errors against the
goal (p50 within 10%, p99 within 20%). `max_batch` and `kv_tokens` are the server's settings
(its slots or `max_num_seqs`, its context or cache size), given on the command line.

Bounded: every request has a timeout; the number of requests is fixed by the flags.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time
from dataclasses import asdict

import httpx

from llmgw_twin.engines.perf.table import perf_arg
from llmgw_twin.programs.calibrate_fit import (
    GOALS,
    Error,
    Fitted,
    Measured,
    errors,
    fit,
    predict,
    within_goals,
)

TIMEOUT_S = 300.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--url", required=True, help="the server's base URL (http://HOST:PORT)")
    parser.add_argument("--model", required=True, help="the model name the server answers to")
    parser.add_argument("--max-batch", type=int, default=4, help="the server's batch limit")
    parser.add_argument("--kv-tokens", type=int, default=4096, help="its KV cache in tokens")
    parser.add_argument("--name", default="calibrated", help="the entry's ENGINE/MODEL/GPU name")
    parser.add_argument(
        "--prompts", default="16,64,256,512", help="prompt lengths of the lone requests"
    )
    parser.add_argument("--repeat", type=int, default=3, help="each measurement this many times")
    parser.add_argument("--decode-tokens", type=int, default=32, help="answer length in batches")
    parser.add_argument("--held-out", type=int, default=60, help="requests of the held-out load")
    parser.add_argument("--rate", type=float, default=2.0, help="its arrivals a second (Poisson)")
    parser.add_argument("--max-prompt", type=int, default=512, help="its longest prompt")
    parser.add_argument("--max-output", type=int, default=48, help="its longest answer")
    parser.add_argument("--seed", type=int, default=0, help="its draws")
    parser.add_argument("-o", "--output", choices=("text", "json"), default="text")


def _body(model: str, prompt_tokens: int, output_tokens: int, nonce: int) -> dict[str, object]:
    # a word of its own first: no two prompts share a prefix an engine could reuse from its cache
    words = [f"r{nonce}", *(["hi"] * max(0, prompt_tokens - 1))]
    return {
        "model": model,
        "messages": [{"role": "user", "content": " ".join(words)}],
        "max_tokens": output_tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
        "ignore_eos": True,  # llama-server, vLLM and SGLang honour it: the answer's full length
        "temperature": 0,
        "cache_prompt": False,  # llama-server: prefill the whole prompt every time
    }


class Driver:
    def __init__(self, client: httpx.AsyncClient, url: str, model: str) -> None:
        self.client = client
        self.url = url.rstrip("/")
        self.model = model
        self.t0 = time.perf_counter()
        self.sent = 0

    def now_us(self) -> int:
        return int((time.perf_counter() - self.t0) * 1_000_000)

    async def one(self, prompt_tokens: int, output_tokens: int, decoding_with: int = 1) -> Measured:
        start = self.now_us()
        first: int | None = None
        pieces = 0
        usage: dict[str, int] | None = None
        self.sent += 1
        body = _body(self.model, prompt_tokens, output_tokens, self.sent)
        async with self.client.stream("POST", f"{self.url}/v1/chat/completions", json=body) as r:
            if r.status_code != 200:
                await r.aread()
                raise RuntimeError(f"the server answered {r.status_code}: {r.text[:200]}")
            async for line in r.aiter_lines():
                if not line.startswith("data: {"):
                    continue
                data = json.loads(line[len("data: ") :])
                usage = data.get("usage") or usage
                for choice in data.get("choices") or ():
                    if (choice.get("delta") or {}).get("content"):
                        pieces += 1
                        first = self.now_us() if first is None else first
        end = self.now_us()
        first = end if first is None else first
        return Measured(
            arrived_us=start,
            prompt_tokens=int(usage["prompt_tokens"]) if usage else prompt_tokens,
            output_tokens=int(usage["completion_tokens"]) if usage else pieces,
            ttft_us=first - start,
            e2e_us=end - start,
            decoding_with=decoding_with,
        )

    async def prefills(self, lengths: list[int], repeat: int) -> list[Measured]:
        return [await self.one(n, 2) for _ in range(repeat) for n in lengths]

    async def decodes(self, max_batch: int, tokens: int, repeat: int) -> list[Measured]:
        out: list[Measured] = []
        sizes = sorted({1, 2, 4, 8, max_batch} & set(range(1, max_batch + 1)))
        for _ in range(repeat):
            for k in sizes:
                out += await asyncio.gather(*(self.one(8, tokens, k) for _ in range(k)))
        return out

    async def held_out(self, args: argparse.Namespace) -> list[Measured]:
        rng = random.Random(f"calibrate/{args.seed}")
        at = 0.0
        plan: list[tuple[float, int, int]] = []
        for _ in range(args.held_out):
            at += rng.expovariate(args.rate)
            plan.append((at, rng.randint(8, args.max_prompt), rng.randint(4, args.max_output)))
        base = self.now_us()

        async def send(when: float, prompt: int, output: int) -> Measured:
            await asyncio.sleep(max(0.0, base / 1e6 + when - self.now_us() / 1e6))
            m = await self.one(prompt, output)
            return Measured(
                m.arrived_us - base, m.prompt_tokens, m.output_tokens, m.ttft_us, m.e2e_us
            )

        return list(await asyncio.gather(*(send(*p) for p in plan)))


async def calibrate(args: argparse.Namespace) -> tuple[Fitted, list[Error]]:
    lengths = [int(x) for x in str(args.prompts).split(",") if x.strip()]
    # a fresh connection a request: a server may close an idle kept-alive one under the client
    limits = httpx.Limits(max_keepalive_connections=0)
    async with httpx.AsyncClient(timeout=TIMEOUT_S, limits=limits) as client:
        driver = Driver(client, args.url, args.model)
        await driver.one(8, 2)  # warm-up, not counted
        prefills = await driver.prefills(lengths, args.repeat)
        decodes = await driver.decodes(args.max_batch, args.decode_tokens, args.repeat)
        fitted = fit(prefills, decodes, args.max_batch, args.kv_tokens, args.name)
        load = await driver.held_out(args)
    return fitted, errors(load, predict(fitted, load))


def _text(fitted: Fitted, errs: list[Error]) -> str:
    perf = fitted.perf
    lines = [
        f"fitted {perf.name}: a = {float(perf.iteration_us):.1f} us, "
        f"b = {float(perf.prefill_us_per_token):.3f} us/prompt token, "
        f"c = {float(perf.decode_us_per_token):.3f} us/request in the batch; "
        f"outside the engine {fitted.overhead_us / 1000:.1f} ms a request",
        f"  --perf-model {perf_arg(perf)}",
        "held-out load: measured vs predicted (goal: p50 within "
        f"{GOALS['p50']:.0%}, p99 within {GOALS['p99']:.0%})",
    ]
    for e in errs:
        goal = GOALS[e.metric.split()[1]]
        mark = "ok  " if e.relative <= goal else "MISS"
        lines.append(
            f"  {mark} {e.metric:<8} measured {e.measured_ms:9.1f} ms  predicted "
            f"{e.predicted_ms:9.1f} ms  error {e.relative:6.1%}"
        )
    lines.append("within the goal" if within_goals(errs) else "outside the goal")
    return "\n".join(lines)


def main(args: argparse.Namespace) -> int:
    try:
        fitted, errs = asyncio.run(calibrate(args))
    except (httpx.HTTPError, RuntimeError, ValueError) as e:
        print(f"calibrate: {e}", file=sys.stderr)
        return 1
    if args.output == "json":
        perf = fitted.perf
        report = {
            "entry": {"name": perf.name, "perf_model": perf_arg(perf)},
            "overhead_ms": fitted.overhead_us / 1000,
            "errors": [{**asdict(e), "relative": e.relative} for e in errs],
            "within_goal": within_goals(errs),
        }
        print(json.dumps(report, indent=2))
    else:
        print(_text(fitted, errs))
    return 0
