"""The launch policy's tables: per program, the flags that take paths and the flags held back.

Role: data only, read by `policy.check_launch`. Keyed by each engine program's default binary
(`Program.default_binary`: `vllm`, `sglang`, `llama-server`, `ggml-rpc-server`, and the sim
engine's `llmgw-twin`). Written against the flag lists of the pinned versions
(`engines/flags/`) and the engines' own help texts: every flag named here is in its program's
list (tested), and every alias of a classified llama.cpp flag is classified alike (tested from the
list's `same-as` marks; vLLM's short forms and SGLang's aliases are listed by hand).

- A **path flag**'s value must resolve under `policy.model_dirs` (weights, tokenizers, adapters:
  what the engine loads as a model) or `policy.path_dirs` (everything else it reads or writes).
  `one`: the value is one path; `list`: comma-separated paths; `scaled`: comma-separated
  `PATH:SCALE`. `keywords`: values that are not paths (vLLM's `--generation-config vllm`).
- A **held-back flag** runs only when `policy.allow_flags` lists it; its entry says why, as the
  end of the sentence "flag X is refused: it ...". A flag whose value can hold paths in a form
  the policy does not read (a JSON or YAML config, `name=path` pairs, several values) is held
  back too, as is every flag ending in one of `held_suffixes` that is not a path flag.

Flags neither list names are taken as harmless tuning (sizes, kernels, sampling, logging levels).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

DirsKey = Literal["model_dirs", "path_dirs"]


@dataclass(frozen=True, slots=True)
class PathFlag:
    dirs: DirsKey
    form: Literal["one", "list", "scaled"] = "one"
    keywords: frozenset[str] = frozenset()


@dataclass(frozen=True, slots=True)
class ProgramRules:
    paths: Mapping[str, PathFlag]
    held: Mapping[str, str]
    """flag -> why it is held back (the end of "it ...")."""
    held_suffixes: tuple[str, ...] = ()
    checks_model_path: bool = True
    """The spec's model path must be under `model_dirs` (the sim engine never opens it)."""
    aliases_listed: bool = False
    """The list marks aliases (`same-as:`), so the test can hold the tables to them."""


TRUST = "runs Python code shipped with the model (trust_remote_code)"
CODE = "can run code that is not the engine's own (a module, plugin, program or tool)"
CLIENTS = "lets API clients reach files, tools or settings on the node"
AGENT = "is set by the agent itself: where the engine listens and how it meets its peers"
NETWORK = "opens listeners or connections the agent does not manage"
DOWNLOAD = "fetches a model from outside the agent's policy.model_dirs"
OPAQUE = "takes a value whose paths, modules or endpoints the policy does not read"


def _paths(
    dirs: DirsKey, *flags: str, form: Literal["one", "list", "scaled"] = "one"
) -> dict[str, PathFlag]:
    return {f: PathFlag(dirs, form) for f in flags}


def _held(why: str, *flags: str) -> dict[str, str]:
    return dict.fromkeys(flags, why)


VLLM = ProgramRules(
    paths={
        **_paths("model_dirs", "--model", "--tokenizer", "--hf-config-path", "--spec-model"),
        "--generation-config": PathFlag("model_dirs", keywords=frozenset({"auto", "vllm"})),
        **_paths(
            "path_dirs",
            "--download-dir",
            "--chat-template",
            "--ssl-keyfile",
            "--ssl-certfile",
            "--ssl-ca-certs",
            "--mm-encoder-fp8-scale-path",
            "--mm-encoder-fp8-scale-save-path",
        ),
    },
    held={
        "--trust-remote-code": TRUST,
        **_held(
            CODE,
            "--worker-cls",
            "--worker-extension-cls",
            "--scheduler-cls",
            "--logits-processors",
            "--middleware",
            "--tool-parser-plugin",
            "--reasoning-parser-plugin",
            "--io-processor-plugin",
            "--model-class-overrides",
            "--distributed-executor-backend",
            "--log-config-file",
            "--tool-server",
        ),
        **_held(
            CLIENTS,
            "--allowed-local-media-path",
            "--trust-request-chat-template",
            "--trust-request-mm-kwargs",
        ),
        **_held(
            AGENT,
            *("--host", "--port", "--uds", "--master-addr", "--master-port", "--headless"),
            *("--nnodes", "-n", "--node-rank", "-r"),
        ),
        **_held(
            NETWORK,
            *("--data-parallel-size", "-dp", "--data-parallel-size-local", "-dpl"),
            *("--data-parallel-address", "-dpa", "--data-parallel-rpc-port", "-dpp"),
            *("--data-parallel-rank", "-dpn", "--data-parallel-start-rank", "-dpr"),
            *("--data-parallel-backend", "-dpb", "--data-parallel-hybrid-lb", "-dph"),
            *("--data-parallel-external-lb", "-dpe"),
            *("--data-parallel-multi-port-external-lb", "-dpm"),
            *("--data-parallel-supervisor-port", "--grpc", "--grpc-port"),
            "--otlp-traces-endpoint",
        ),
        # JSON configs by their short forms (the long ones end in -config), and values that
        # name paths in pairs or JSON
        **_held(OPAQUE, "-cc", "-sc", "-ac", "-dc", "--lora-modules", "--default-mm-loras"),
    },
    held_suffixes=("-config", "-overrides"),
)

SGLANG = ProgramRules(
    paths={
        **_paths(
            "model_dirs",
            *("--model-path", "--model", "--tokenizer-path"),
            *("--speculative-draft-model-path", "--speculative-draft-model"),
            *("--kt-weight-path", "--uno-lora-path", "--quantization-param-path"),
            *("--modelopt-checkpoint-restore-path", "--speculative-token-map"),
            *("--decrypted-config-file", "--decrypted-draft-config-file"),
        ),
        **_paths(
            "path_dirs",
            *("--download-dir", "--chat-template", "--completion-template"),
            *("--ssl-keyfile", "--ssl-certfile", "--ssl-ca-certs"),
            *("--crash-dump-folder", "--debug-tensor-dump-input-file"),
            *("--debug-tensor-dump-output-folder", "--export-metrics-to-file-dir"),
            *("--file-storage-path", "--spec-trace-dir", "--ple-offload-dir"),
            *("--modelopt-checkpoint-save-path", "--modelopt-export-path"),
            "--speculative-dspark-confidence-sts-path",
            "--speculative-dspark-sps-table-path",
            "--speculative-ngram-external-corpus-path",
            "--rl-quant-profile",
        ),
    },
    held={
        "--trust-remote-code": TRUST,
        **_held(
            CODE,
            *("--custom-weight-loader", "--forward-hooks", "--enable-custom-logit-processor"),
            *("--sidecar", "--sidecar-args", "--tool-server", "--hicache-storage-backend"),
        ),
        **_held(CLIENTS, "--trust-request-chat-template"),
        **_held(
            AGENT,
            *("--host", "--port", "--nnodes", "--node-rank", "--dist-init-addr"),
            "--nccl-init-addr",
        ),
        **_held(
            NETWORK,
            *("--nccl-port", "--grpc-port", "--grpc-mode", "--smg-grpc-mode"),
            *("--smg-http-sidecar-port", "--grpc-http-sidecar-port"),
            *("--disaggregation-mode", "--disaggregation-bootstrap-port"),
            *("--encoder-bootstrap-port", "--encoder-register-urls", "--encoder-urls"),
            *("--engine-info-bootstrap-port", "--gated-launch-port"),
            *("--decoupled-spec-bind-endpoint", "--decoupled-spec-connect-endpoints"),
            *("--load-publish-endpoint", "--otlp-traces-endpoint", "--use-ray"),
            "--remote-instance-weight-loader-backend",
            "--remote-instance-weight-loader-seed-instance-ip",
            "--remote-instance-weight-loader-seed-instance-service-port",
            "--remote-instance-weight-loader-send-weights-group-ports",
            "--remote-instance-weight-loader-start-seed-via-transfer-engine",
            *("--enable-http-worker-reuseport", "--weight-cache-socket", "--weight-cache-mode"),
            "--enable-lmcache",
        ),
        **_held(
            OPAQUE,
            *("--lora-paths", "--log-requests-target", "--model-checksum"),
            "--json-model-override-args",
        ),
    },
    held_suffixes=("-config", "-config-file", "-config-path"),
)

LLAMA_SERVER = ProgramRules(
    paths={
        **_paths("model_dirs", "--model", "-m", "--mmproj", "-mm"),
        **_paths("model_dirs", "--spec-draft-model", "-md", "--model-draft"),
        **_paths("model_dirs", "--lookup-cache-static", "-lcs"),
        **_paths("model_dirs", "--lora", "--control-vector", form="list"),
        **_paths("model_dirs", "--lora-scaled", "--control-vector-scaled", form="scaled"),
        **_paths(
            "path_dirs",
            *("--log-file", "--slot-save-path", "--log-prompts-dir", "--grammar-file"),
            *("--json-schema-file", "-jf", "--lookup-cache-dynamic", "-lcd"),
            *("--api-key-file", "--ssl-key-file", "--ssl-cert-file", "--chat-template-file"),
            *("--ui-config-file", "--webui-config-file"),
        ),
    },
    held={
        **_held(
            CODE,
            *("--tools", "--tools-runtime", "--agent", "-ag"),
            *("--mcp-servers-config", "--mcp-servers-json", "--video-ffmpeg-dir"),
            *("--models-preset", "--models-dir"),
        ),
        **_held(CLIENTS, "--props", "--path", "--media-path"),
        **_held(AGENT, "--host", "--port", "--reuse-port", "--rpc"),
        **_held(NETWORK, "--ui-mcp-proxy", "--webui-mcp-proxy"),
        **_held(
            DOWNLOAD,
            *("--model-url", "-mu", "--hf-repo", "-hf", "-hfr", "--hf-file", "-hff"),
            *("--docker-repo", "-dr", "--mmproj-url", "-mmu"),
            *("--spec-draft-hf", "-hfd", "-hfrd", "--hf-repo-draft"),
            *("--embd-gemma-default", "--gpt-oss-20b-default", "--gpt-oss-120b-default"),
            *("--fim-qwen-1.5b-default", "--fim-qwen-3b-default", "--fim-qwen-7b-default"),
            *("--fim-qwen-7b-spec", "--fim-qwen-14b-spec", "--fim-qwen-30b-default"),
            *("--vision-gemma-4b-default", "--vision-gemma-12b-default"),
        ),
    },
    aliases_listed=True,
)

RPC_SERVER = ProgramRules(
    paths={},
    held=_held(AGENT, "--host", "-H", "--port", "-p"),
    aliases_listed=True,
)

SIM = ProgramRules(
    paths={},
    held=_held(
        AGENT,
        *("--host", "--port", "--rendezvous", "--rendezvous-bind", "--source-host"),
        *("--nnodes", "--node-rank", "--pace-file", "--ready-file"),
    ),
    checks_model_path=False,
)

RULES: Mapping[str, ProgramRules] = {
    "vllm": VLLM,
    "sglang": SGLANG,
    "llama-server": LLAMA_SERVER,
    "ggml-rpc-server": RPC_SERVER,
    "llmgw-twin": SIM,
}


def governed(flag: str) -> bool:
    """Whether listing `flag` in `allow_flags` can change anything: some program holds it back
    or checks its path."""
    for rules in RULES.values():
        if flag in rules.held or flag in rules.paths:
            return True
        if any(flag.endswith(s) for s in rules.held_suffixes):
            return True
    return False
