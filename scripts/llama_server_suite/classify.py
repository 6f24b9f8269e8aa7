"""Why an upstream llama-server test does not pass against ``pyramid-gguf serve``: a category
per test (``model-bound``, ``missing feature``, ...), from the curated :data:`REASONS` (file,
test-name prefix -> category and reason), else read from the failure's message."""

from __future__ import annotations

import re

MISSING = "missing feature"
BOUND = "model-bound"
SAMPLER = "sampler/template feature (in progress)"
CHOICE = (
    "our choice (the real APIs' behaviour where llama-server differs: OpenAI's shape on /v1, "
    "Anthropic's 400s, Responses' incomplete)"
)

#: (file, test name or a glob with ``*``) -> (category, reason), the first match wins. A test's
#: parameters follow its name in brackets, so a name without them covers every
#: parametrization.
REASONS: dict[tuple[str, str], tuple[str, str]] = {
    # basic
    ("basic", "test_server_multiple_addresses"): (MISSING, "--host with several addresses"),
    ("basic", "test_load_split_model"): (BOUND, "a split GGUF of stories15M and its text"),
    ("basic", "test_no_ui"): (MISSING, "no web UI at /"),
    ("basic", "test_server_model_aliases_and_tags"): (MISSING, "several --alias, --tags"),
    # chat_completion
    ("chat_completion", "test_chat_completion"): (BOUND, "stories260K's text and token counts"),
    ("chat_completion", "test_chat_completion_cached_tokens"): (BOUND, "its token counts"),
    ("chat_completion", "test_chat_completion_stream"): (BOUND, "stories260K's text"),
    ("chat_completion", "test_chat_completion_with_openai_library"): (BOUND, "its text"),
    ("chat_completion", "test_chat_template"): (MISSING, "--verbose's __verbose (the prompt)"),
    ("chat_completion", "test_chat_template_assistant_prefill"): (
        MISSING,
        "continuing a last assistant message (prefill); --verbose's __verbose",
    ),
    ("chat_completion", "test_chat_template_continue_final_message_vllm_compat"): (
        MISSING,
        "continue_final_message; --verbose's __verbose",
    ),
    ("chat_completion", "test_chat_template_continue_final_message_mutual_exclusion"): (
        SAMPLER,
        "named template llama3",
    ),
    ("chat_completion", "test_apply_chat_template"): (SAMPLER, "named template command-r"),
    ("chat_completion", "test_return_progress"): (MISSING, "return_progress (prompt progress)"),
    ("chat_completion", "test_chat_completions_multiple_choices"): (SAMPLER, "n > 1"),
    ("chat_completion", "test_verbose_debug"): (MISSING, "the verbose field's __verbose"),
    ("chat_completion", "test_completion_with_response_format[response_format1-10-[ -3000 ]]"): (
        BOUND,
        "the model's text under a schema",
    ),
    # completion
    ("completion", "test_completion"): (BOUND, "stories260K's text and token counts"),
    ("completion", "test_completion_stream"): (BOUND, "stories260K's text and token counts"),
    ("completion", "test_completion_with_openai_library"): (BOUND, "its text"),
    ("completion", "test_completion_stream_with_openai_library"): (BOUND, "its text"),
    ("completion", "test_nocache_long_input_prompt"): (BOUND, "its tokenizer's prompt length"),
    ("completion", "test_completion_response_fields"): (
        BOUND,
        "the prompt as stories260K renders it (`<s> ` before it)",
    ),
    ("completion", "test_n_probs"): (SAMPLER, "n_probs"),
    ("completion", "test_n_probs_stream"): (SAMPLER, "n_probs"),
    ("completion", "test_n_probs_post_sampling"): (SAMPLER, "n_probs, post_sampling_probs"),
    ("completion", "test_n_probs_post_backend_sampling"): (MISSING, "--backend_sampling"),
    ("completion", "test_completion_prompt_cache"): (BOUND, "its tokenizer's prompt lengths"),
    ("completion", "test_completion_with_tokens_input"): (
        BOUND,
        "flaky: our stand-in's 16th greedy token is a 0.019-logit near-tie that the batch's "
        "make-up (the two prompts decoded together or apart, as they arrive) can flip",
    ),
    # security
    ("security", "test_access_static_assets_without_api_key"): (MISSING, "no web UI"),
    ("security", "test_cors_origins_defaults_to_localhost_with_tools_enabled"): (
        MISSING,
        "--tools (llama-server's own tools, with which its CORS defaults to localhost)",
    ),
    ("security", "test_cors_proxy_only_forwards_explicit_proxy_headers"): (
        MISSING,
        "--ui-mcp-proxy",
    ),
    ("security", "test_local_media_file"): (MISSING, "vision (tinygemma3), --media-path"),
    # ctx_shift
    ("ctx_shift", "test_ctx_shift_enabled"): (MISSING, "--context-shift"),
    ("ctx_shift", "test_ctx_shift_disabled_long_prompt"): (
        BOUND,
        "the prompt fits our stand-in's context (stories260K's tokenizer makes it longer)",
    ),
    # metrics
    ("metrics", "test_metrics_prometheus_format"): (
        MISSING,
        "llamacpp:n_tokens_max and the spec_decode_* counters (we count neither)",
    ),
    ("metrics", "test_metrics_timings_on_prompt_progress"): (MISSING, "return_progress"),
    # tokenize
    ("tokenize", "test_tokenize_with_bos"): (BOUND, "BOS id 1 of stories260K"),
    ("chat_completion", "test_logprobs_stream"): (
        CHOICE,
        'our /v1 role chunk has content "" as OpenAI sends it (null off /v1, as llama-server)',
    ),
    ("ctx_shift", "test_ctx_shift_disabled_short_prompt"): (
        BOUND,
        "our stand-in ends its answer (EOS) long before 64 tokens; stories260K never does",
    ),
    ("ctx_shift", "test_ctx_shift_disabled_stream"): (
        BOUND,
        "our stand-in ends its answer (finish_reason stop) before the context is full",
    ),
    # compat_anthropic, compat_oai_responses: where llama-server and the real APIs differ, the API
    ("compat_anthropic", "test_anthropic_tool_result_with_image"): (
        CHOICE,
        "an image to a text-only model: our 400 (Anthropic's API: a client error), its 500",
    ),
    ("compat_anthropic", "test_anthropic_vision_format_accepted"): (
        CHOICE,
        "an image to a text-only model: our 400 (Anthropic's API: a client error), its 500",
    ),
    ("compat_anthropic", "test_anthropic_vision_base64_with_multimodal_model"): (
        MISSING,
        "vision (tinygemma3 and its mmproj)",
    ),
    ("compat_anthropic", "test_anthropic_empty_messages"): (
        CHOICE,
        "an empty `messages`: our 400, as Anthropic's API; llama-server answers it",
    ),
    ("compat_oai_responses", "test_responses_with_openai_library"): (BOUND, "its text"),
    ("compat_oai_responses", "test_responses_stream_with_llama_telemetry"): (
        CHOICE,
        "an answer cut at max_output_tokens ends `response.incomplete`, as OpenAI's API; "
        "it expects `response.completed`",
    ),
}


def classify(file: str, test: str, outcome: str, message: str) -> str:
    """The category of one test's ``outcome`` (``""`` for a pass)."""
    if outcome == "passed":
        return ""
    if outcome == "skipped":
        return "skipped by the suite"
    for (f, pattern), (category, _) in REASONS.items():
        if f == file and _matches(test, pattern):
            return category
    if "Server did not start within" in message:
        return "slow start (the shared 2-core machine under load)"
    if "Server process died" in message:
        return "refused by the shim (flag or model we lack)"
    return "unclassified"


def reason(file: str, test: str) -> str:
    """The curated reason of a test, or ``""``."""
    for (f, pattern), (_, why) in REASONS.items():
        if f == file and _matches(test, pattern):
            return why
    return ""


def _matches(test: str, pattern: str) -> bool:
    """``pattern`` is a test's name (any of its parametrizations) or, with ``*``, a glob."""
    if "*" in pattern:
        return re.fullmatch(".*".join(map(re.escape, pattern.split("*"))), test) is not None
    return test == pattern or test.startswith(pattern + "[")
