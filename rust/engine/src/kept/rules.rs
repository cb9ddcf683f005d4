//! The redaction's rules (`otel_llm/processor/redaction/synthesis.py` `Redaction`): what a key
//! alone decides (its class), and whether an attribute of that class and value is removed.

use std::collections::{HashMap, HashSet};

use super::value::Value;
use super::RedactionCounts;
use super::Redaction;

// `synthesis.py`'s key classes (`_ALLOWED` ... `_METADATA_URL`), the bits of the class and the
// GenAI bit (`_CLASS`, `_GENAI`).
pub(crate) const ALLOWED: u8 = 0;
pub(crate) const BLOCKED: u8 = 1;
pub(crate) const NOT_METADATA: u8 = 2;
pub(crate) const METADATA: u8 = 3;
pub(crate) const METADATA_URL: u8 = 4;
pub(crate) const CLASS: u8 = 0x7;
pub(crate) const GENAI: u8 = 0x8;

/// `synthesis.GENAI_KEY_PREFIXES`: a key of these makes its span a GenAI span (the free-text rule's).
pub(crate) const GENAI_KEY_PREFIXES: [&str; 4] = ["gen_ai.", "llm.", "openinference.", "traceloop."];
/// `synthesis._KEY_CACHE_LIMIT`: keys are the sender's, the cache must not grow with whatever they send.
const KEY_CACHE_LIMIT: usize = 4096;

/// A pattern of `fnmatch.translate`, matched as `re.match` matches its translation (the whole key):
/// `*` any run of characters (newlines included: `(?s:...)`), `?` any one character (a code point),
/// every other character itself. `[` starts a character class in `fnmatch`, whose translation
/// (ranges, negation, escapes, empty sets) is not ported: a pattern with one is refused when the
/// writer is made, and the binding keeps Python's writer.
#[derive(Clone, Debug)]
pub(crate) struct Glob(Vec<char>);

impl Glob {
    pub fn new(pattern: &str) -> Result<Glob, String> {
        if pattern.contains('[') {
            return Err(format!("the glob {pattern:?} has a character class ('['), which the native writer does not \
                                match as fnmatch does"));
        }
        Ok(Glob(pattern.chars().collect()))
    }

    /// Whether the whole `key` matches. `fnmatch.translate` makes each run of text between two `*`
    /// an atomic group matching its first occurrence: a segment of fixed length is matched at its
    /// leftmost place either way, so this is the classic matcher that backtracks to the last `*`.
    pub fn matches(&self, key: &str) -> bool {
        let pattern = &self.0;
        let key: Vec<char> = key.chars().collect();
        let (mut p, mut k) = (0usize, 0usize);
        let mut resume: Option<(usize, usize)> = None; // after the last `*`: its pattern position, the key's
        while k < key.len() {
            if p < pattern.len() && pattern[p] == '*' {
                p += 1;
                resume = Some((p, k));
            } else if p < pattern.len() && (pattern[p] == '?' || pattern[p] == key[k]) {
                p += 1;
                k += 1;
            } else if let Some((star_p, star_k)) = resume {
                p = star_p;
                k = star_k + 1;
                resume = Some((star_p, star_k + 1));
            } else {
                return false;
            }
        }
        pattern[p..].iter().all(|c| *c == '*')
    }
}

/// What removing an attribute comes to (`Redaction._removes`).
#[derive(Debug, PartialEq)]
pub(crate) enum Verdict {
    Keep,
    /// Kept, a metadata URL without its userinfo, query and fragment.
    KeepReduced(String),
    Remove,
}

/// `Redaction`, compiled: the settings as sets and globs, and each key's class remembered.
#[derive(Debug)]
pub(crate) struct Rules {
    prefixes: Vec<String>,
    patterns: Vec<Glob>,
    event_names: HashSet<String>,
    pub max_free_text_bytes: usize,
    allowed_keys: HashSet<String>,
    allowed_patterns: Vec<Glob>,
    metadata_keys: Option<HashSet<String>>,
    url_keys: HashSet<String>,
    pub error_type_key: String,
    /// `STATUS_MESSAGE_KEY`'s class (`_redact_status` judges the status message as its text).
    pub status_class: u8,
    classes: HashMap<Box<str>, u8, foldhash::fast::RandomState>,
}

impl Rules {
    pub fn new(redaction: &Redaction) -> Result<Rules, String> {
        let globs = |patterns: &[String]| patterns.iter().map(|p| Glob::new(p)).collect::<Result<Vec<_>, _>>();
        let mut rules = Rules {
            prefixes: redaction.key_prefixes.clone(),
            patterns: globs(&redaction.key_patterns)?,
            event_names: redaction.event_names.iter().cloned().collect(),
            max_free_text_bytes: redaction.max_free_text_bytes,
            allowed_keys: redaction.allowed_keys.iter().cloned().collect(),
            allowed_patterns: globs(&redaction.allowed_patterns)?,
            metadata_keys: redaction.metadata_keys.as_ref().map(|keys| keys.iter().cloned().collect()),
            url_keys: redaction.url_keys.iter().cloned().collect(),
            error_type_key: redaction.error_type_key.clone(),
            status_class: ALLOWED,
            classes: HashMap::default(),
        };
        rules.status_class = rules.decide(&redaction.status_message_key) & CLASS;
        Ok(rules)
    }

    /// `metadata_keys is not None`: text is kept only under a known key.
    pub fn allowlist(&self) -> bool {
        self.metadata_keys.is_some()
    }

    pub fn content_event(&self, name: &str) -> bool {
        self.event_names.contains(name)
    }

    /// Whether `_strip` removes nothing whatever it is given (it returns at once: `allow_content`).
    pub fn strips_nothing(&self, limit: usize) -> bool {
        !self.allowlist() && limit == 0 && self.prefixes.is_empty() && self.patterns.is_empty()
    }

    /// `Redaction._key_class`: the key's class, `GENAI` set for a GenAI key; remembered for the first
    /// `KEY_CACHE_LIMIT` keys, as Python's cache.
    pub fn key_class(&mut self, key: &str) -> u8 {
        if let Some(class) = self.classes.get(key) {
            return *class;
        }
        let class = self.decide(key);
        if self.classes.len() < KEY_CACHE_LIMIT {
            self.classes.insert(key.into(), class);
        }
        class
    }

    #[cfg(test)]
    pub fn cached(&self) -> usize {
        self.classes.len()
    }

    fn decide(&self, key: &str) -> u8 {
        let allowed = self.allowed_keys.contains(key) || self.allowed_patterns.iter().any(|g| g.matches(key));
        let blocked = || self.prefixes.iter().any(|p| key.starts_with(p.as_str())) || self.patterns.iter().any(|g| g.matches(key));
        let mut class = if allowed {
            ALLOWED
        } else if blocked() {
            BLOCKED
        } else if self.metadata_keys.as_ref().is_none_or(|keys| keys.contains(key)) {
            if self.url_keys.contains(key) { METADATA_URL } else { METADATA }
        } else {
            NOT_METADATA
        };
        if GENAI_KEY_PREFIXES.iter().any(|p| key.starts_with(p)) {
            class |= GENAI;
        }
        class
    }

    /// `Redaction._removes`: whether the rules remove an attribute of this class (`& CLASS`) and value
    /// (`None`: no value field), counted; a metadata URL that is kept comes back reduced. `limit`: the
    /// free-text rule's bytes on this span (0: off).
    pub fn removes(&self, value: Option<&Value<'_>>, class: u8, limit: usize, counts: &mut RedactionCounts) -> Verdict {
        if class == ALLOWED {
            return Verdict::Keep;
        }
        if class == BLOCKED {
            counts.content_keys += 1;
            return Verdict::Remove;
        }
        let scalar = value.is_none_or(Value::is_scalar);
        let mut reduced = None;
        if self.allowlist() && !scalar {
            if class == NOT_METADATA {
                counts.not_allowed += 1;
                return Verdict::Remove;
            }
            if let (METADATA_URL, Some(Value::Str(text))) = (class, value) {
                let url = reduced_url(text);
                if url != *text {
                    counts.url_reduced += 1;
                    reduced = Some(url.to_string());
                }
            }
        }
        if limit > 0 {
            // `_is_free_text`: a string's length in UTF-8 (what its two tests come to), else
            // `ByteSize()` of an array, a map or bytes; a scalar never is.
            let size = match (&reduced, value) {
                (Some(url), _) => Some(url.len()),
                (None, Some(Value::Str(text))) => Some(text.len()),
                (None, Some(v @ (Value::Array(..) | Value::KvList(..) | Value::Bytes(_)))) => Some(v.size()),
                _ => None,
            };
            if size.is_some_and(|size| size > limit) {
                counts.free_text += 1;
                return Verdict::Remove;
            }
        }
        match reduced {
            Some(url) => Verdict::KeepReduced(url),
            None => Verdict::Keep,
        }
    }
}

/// `synthesis.reduced_url`: the URL without userinfo, query and fragment (a slice of it, or one
/// with its userinfo cut out).
pub(crate) fn reduced_url(url: &str) -> std::borrow::Cow<'_, str> {
    let cut = [url.find('?'), url.find('#')].into_iter().flatten().min().unwrap_or(url.len());
    let url = &url[..cut];
    if let Some(scheme_end) = url.find("://") {
        let authority_start = scheme_end + 3;
        let authority_end = url[authority_start..].find('/').map_or(url.len(), |i| authority_start + i);
        if let Some(at) = url[authority_start..authority_end].rfind('@') {
            return format!("{}{}", &url[..authority_start], &url[authority_start + at + 1..]).into();
        }
    }
    url.into()
}
