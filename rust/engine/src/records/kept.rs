//! Which spans' attributes Python keeps for the records (`BufferedSpan.attrs`).
//!
//! The digest keeps the configured keys of the attributes `adapters.engines.classify` read and
//! returned (`digest._digest`), so Python's records see no attribute at all of a span `classify`
//! did not read (`may_be_llm` is false: an application's INTERNAL span), of an SGLang stage span
//! (`classify` reads none), and of a span an adapter claimed but intake refused (`MalformedSpan`:
//! it is buffered with no observation and no attributes). This crate reads attributes from the
//! span's bytes, so it asks these rules first: a span they say Python kept nothing of reads as
//! having no attribute, as it does in Python.

use crate::model::{array_first, span_attribute, AnyValue, SPAN_KIND_CLIENT, SPAN_KIND_INTERNAL, SPAN_KIND_SERVER,
                   STATUS_CODE_ERROR};

/// `adapters.engines.SGLANG_STAGES`.
pub(super) const SGLANG_STAGES: [&str; 18] = [
    "tokenize", "api_server_dispatch", "dpc_dispatch", "request_process", "prefill_waiting", "prefill_forward",
    "chunked_prefill", "decode_waiting", "decode_forward", "decode_loop", "prefill_prepare", "prefill_bootstrap",
    "prefill_transfer_kv_cache", "decode_prepare", "decode_bootstrap", "decode_transferred", "fake_output",
    "quick_finish",
];
/// `adapters.engines.TGI_HANDLER_SPANS`.
const TGI_HANDLER_SPANS: [&str; 5] = ["generate", "generate_stream", "chat_completions", "completions", "compat_generate"];
/// `adapters.engines.LLMD_PROXY_SPANS`' names.
const LLMD_PROXY_SPANS: [&str; 4] = ["prefill", "decode", "llm_d.pd_proxy.prefill", "llm_d.pd_proxy.decode"];
/// `adapters.engines.LOGFIRE_AGENT_LLM_PREFIXES`.
const LOGFIRE_AGENT_LLM_PREFIXES: [&str; 2] = ["Responses API", "Chat completion with "];
/// `adapters.engines.GENAI_OPERATIONS`.
pub(super) const GENAI_OPERATIONS: [&str; 9] = ["chat", "text_completion", "embeddings", "generate_content",
                                                "execute_tool", "invoke_agent", "create_agent", "invoke_workflow",
                                                "retrieval"];
const VLLM_SPAN_NAME: &str = "llm_request";
const LITELLM_SPAN_NAME: &str = "litellm_request";
const DYNAMO_ROOT: &str = "http-request";
const DYNAMO_WORKER: &str = "engine.generate";

/// `adapters.engines._INTERNAL_NAMES`.
fn internal_name(name: &str) -> bool {
    name == VLLM_SPAN_NAME || name == LITELLM_SPAN_NAME || name == DYNAMO_ROOT || name == DYNAMO_WORKER
        || TGI_HANDLER_SPANS.contains(&name) || SGLANG_STAGES.contains(&name) || LLMD_PROXY_SPANS.contains(&name)
}

/// `adapters.engines.may_be_llm`: `classify`'s first test, on a span's kind and name alone.
pub(super) fn may_be_llm(kind: i32, name: &str) -> bool {
    if kind == SPAN_KIND_SERVER || kind == SPAN_KIND_CLIENT {
        return true;
    }
    internal_name(name) || name.contains(" Req ")
        || GENAI_OPERATIONS.contains(&name.split(' ').next().unwrap_or(""))
        || LOGFIRE_AGENT_LLM_PREFIXES.iter().any(|prefix| name.starts_with(prefix))
}

/// `attributes.get_str(attrs, key) == text`: a string, or an array whose first element (read so
/// again) is one; no int, bool or `repr` of a double spells a name with a colon.
fn str_is(value: Option<AnyValue<'_>>, text: &str) -> bool {
    let mut value = value;
    loop {
        match value {
            Some(AnyValue::Str(found)) => return found == text,
            Some(AnyValue::Array(array)) => value = array_first(array),
            _ => return false,
        }
    }
}

/// `attributes.get_str(attrs, key) is None`: nothing, no value, a map, bytes, an empty array, or
/// an array whose first element reads so.
fn no_str(value: Option<AnyValue<'_>>) -> bool {
    let mut value = value;
    loop {
        match value {
            None | Some(AnyValue::Empty) | Some(AnyValue::KvList(_)) | Some(AnyValue::Bytes(_)) => return true,
            Some(AnyValue::Array(array)) => value = array_first(array),
            Some(_) => return false,
        }
    }
}

/// Whether Python keeps the attributes of a span no adapter's observation came with: `classify`
/// read it (`may_be_llm`) and no adapter claimed it (`classify`'s branches that return an
/// observation, in its order; a claimed span without an observation was refused at intake).
pub(super) fn unobserved_keeps(kind: i32, status_code: i32, name: &str, body: &[u8]) -> bool {
    if !may_be_llm(kind, name) {
        return false;
    }
    if kind == SPAN_KIND_INTERNAL && SGLANG_STAGES.contains(&name) {
        return false; // a stage: `classify` reads no attribute of it
    }
    let has = |key: &str| span_attribute(body, key).is_some();
    if name == VLLM_SPAN_NAME && kind == SPAN_KIND_SERVER {
        return false;
    }
    if TGI_HANDLER_SPANS.contains(&name) && !has("gen_ai.latency.e2e") {
        // `_tgi` makes no observation of a handler span without a total time that did not fail
        // (TGI's inner spans share the names): unclaimed. Any other it reads or refuses.
        return no_str(span_attribute(body, "total_time")) && status_code != STATUS_CODE_ERROR;
    }
    if has("gen_ai.latency.e2e") || str_is(span_attribute(body, "module"), "sglang::request") {
        return false;
    }
    if kind == SPAN_KIND_SERVER {
        // Triton's compute span is claimed only without attributes: none to keep either way.
        let flagged = matches!(span_attribute(body, "llm_d.pd_proxy.disaggregation_used"),
                               Some(AnyValue::Bool(true)) | Some(AnyValue::Str("true")));
        if has("triton.model_name") || name == "InferRequest" || (name == "forward_request" && flagged)
            || (name == "gateway.request_orchestration" && has("target_model")) {
            return false;
        }
    } else if kind == SPAN_KIND_INTERNAL
        && ((name == DYNAMO_ROOT && (has("ttft_ms") || has("request.outcome")))
            || (name == DYNAMO_WORKER && has("disagg_role"))
            || (LLMD_PROXY_SPANS.contains(&name) && has("llm_d.pd_proxy.connector"))) {
        return false;
    }
    !(has("gen_ai.operation.name") || has("gen_ai.request.model") || has("gen_ai.response.model"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::push_varint;

    fn body(attributes: &[(&str, &[u8])]) -> Vec<u8> {
        let mut out = Vec::new();
        for (key, value) in attributes {
            let mut entry = vec![0x0a];
            push_varint(&mut entry, key.len() as u64);
            entry.extend_from_slice(key.as_bytes());
            entry.push(0x12);
            push_varint(&mut entry, value.len() as u64);
            entry.extend_from_slice(value);
            out.push(0x4a);
            push_varint(&mut out, entry.len() as u64);
            out.extend_from_slice(&entry);
        }
        out
    }

    const STR_X: &[u8] = b"\x0a\x01x";

    #[test]
    fn may_be_llm_is_classifys_first_test() {
        assert!(may_be_llm(SPAN_KIND_SERVER, "anything"));
        assert!(may_be_llm(SPAN_KIND_CLIENT, "anything"));
        assert!(!may_be_llm(SPAN_KIND_INTERNAL, "db query"));
        assert!(!may_be_llm(0, "handler"));
        for name in ["llm_request", "litellm_request", "prefill_forward", "http-request", "chat gpt-4", "chat",
                     "decode Req 12", "Responses API with 'x'", "Chat completion with 'm'", "llm_d.pd_proxy.decode"] {
            assert!(may_be_llm(SPAN_KIND_INTERNAL, name), "{name}");
        }
        assert!(!may_be_llm(SPAN_KIND_INTERNAL, "chatter"));
        assert!(!may_be_llm(SPAN_KIND_INTERNAL, "Req 12"));
    }

    #[test]
    fn a_claimed_span_without_an_observation_kept_nothing() {
        let route = body(&[("http.route", STR_X)]);
        assert!(unobserved_keeps(SPAN_KIND_SERVER, 0, "POST /v1/chat/completions", &route));
        assert!(!unobserved_keeps(SPAN_KIND_INTERNAL, 0, "handler", &route));
        assert!(!unobserved_keeps(SPAN_KIND_INTERNAL, 0, "prefill_forward", &route));
        assert!(!unobserved_keeps(SPAN_KIND_SERVER, 0, "llm_request", &route));
        assert!(unobserved_keeps(SPAN_KIND_INTERNAL, 0, "llm_request", &route)); // vLLM's name, not its kind
        // TGI's handler names: its inner spans (no total time, not failed) are no request.
        assert!(unobserved_keeps(SPAN_KIND_CLIENT, 0, "generate", &route));
        assert!(!unobserved_keeps(SPAN_KIND_CLIENT, STATUS_CODE_ERROR, "generate", &route));
        assert!(!unobserved_keeps(SPAN_KIND_SERVER, 0, "generate", &body(&[("total_time", STR_X)])));
        assert!(unobserved_keeps(SPAN_KIND_SERVER, 0, "generate", &body(&[("total_time", b"\x3a\x01x")])));
        assert!(!unobserved_keeps(SPAN_KIND_SERVER, 0, "generate", &body(&[("total_time", b"\x18\x01")])));
        assert!(!unobserved_keeps(SPAN_KIND_SERVER, 0, "generate", &body(&[("gen_ai.latency.e2e", STR_X)])));
        assert!(!unobserved_keeps(SPAN_KIND_SERVER, 0, "x", &body(&[("gen_ai.latency.e2e", STR_X)])));
        assert!(!unobserved_keeps(SPAN_KIND_SERVER, 0, "x", &body(&[("gen_ai.request.model", STR_X)])));
        assert!(!unobserved_keeps(SPAN_KIND_CLIENT, 0, "x", &body(&[("gen_ai.operation.name", b"")])));
        // SGLang's module, as a string or an array's first string.
        assert!(!unobserved_keeps(SPAN_KIND_SERVER, 0, "x", &body(&[("module", b"\x0a\x0fsglang::request")])));
        let array = [0x2a, 19, 0x0a, 17, 0x0a, 15, b's', b'g', b'l', b'a', b'n', b'g', b':', b':', b'r', b'e', b'q',
                     b'u', b'e', b's', b't'];
        assert!(!unobserved_keeps(SPAN_KIND_SERVER, 0, "x", &body(&[("module", &array)])));
        assert!(unobserved_keeps(SPAN_KIND_SERVER, 0, "x", &body(&[("module", STR_X)])));
        // Composite engines' spans by kind and name.
        assert!(!unobserved_keeps(SPAN_KIND_SERVER, 0, "y", &body(&[("triton.model_name", STR_X)])));
        assert!(!unobserved_keeps(SPAN_KIND_SERVER, 0, "InferRequest", &route));
        assert!(!unobserved_keeps(SPAN_KIND_SERVER, 0, "forward_request",
                                  &body(&[("llm_d.pd_proxy.disaggregation_used", b"\x10\x01")])));
        assert!(unobserved_keeps(SPAN_KIND_SERVER, 0, "forward_request",
                                 &body(&[("llm_d.pd_proxy.disaggregation_used", b"\x0a\x05false")])));
        assert!(!unobserved_keeps(SPAN_KIND_INTERNAL, 0, "http-request", &body(&[("ttft_ms", b"\x18\x05")])));
        assert!(unobserved_keeps(SPAN_KIND_SERVER, 0, "http-request", &body(&[("ttft_ms", b"\x18\x05")])));
        assert!(!unobserved_keeps(SPAN_KIND_INTERNAL, 0, "engine.generate", &body(&[("disagg_role", STR_X)])));
        assert!(!unobserved_keeps(SPAN_KIND_INTERNAL, 0, "prefill", &body(&[("llm_d.pd_proxy.connector", STR_X)])));
    }
}
