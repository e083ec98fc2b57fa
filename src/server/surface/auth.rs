//! The shared token that guards the client API and the worker stream when
//! one is configured, compared in constant time.

use tonic::metadata::MetadataMap;
use tonic::Status;

#[derive(Clone, Default)]
pub struct Auth {
    token: Option<Vec<u8>>,
}

impl Auth {
    pub fn new(token: Option<String>) -> Auth {
        Auth { token: token.map(|t| t.trim().as_bytes().to_vec()).filter(|t| !t.is_empty()) }
    }

    pub fn enabled(&self) -> bool {
        self.token.is_some()
    }

    /// Checks an `authorization: Bearer TOKEN` value.
    pub fn check_header(&self, header: Option<&str>) -> bool {
        let Some(expected) = &self.token else { return true };
        let presented = header.and_then(|h| h.strip_prefix("Bearer ")).unwrap_or("").as_bytes();
        constant_time_eq(presented, expected)
    }

    pub fn check(&self, metadata: &MetadataMap) -> Result<(), Status> {
        let header = metadata.get("authorization").and_then(|v| v.to_str().ok());
        if self.check_header(header) {
            Ok(())
        } else {
            Err(Status::unauthenticated("a valid token is required: send `authorization: Bearer TOKEN`"))
        }
    }
}

/// Compares without stopping at the first difference, so timing says nothing
/// about how much of a guess was right.
pub(super) fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    let mut difference = (a.len() ^ b.len()) as u8;
    for i in 0..a.len().max(b.len()) {
        difference |= a.get(i).copied().unwrap_or(0) ^ b.get(i).copied().unwrap_or(0);
    }
    difference == 0
}

/// Reads a token from a file (first line), never from the command line.
pub use crate::wire::read_token;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_must_match_exactly() {
        let auth = Auth::new(Some("s3cret".into()));
        assert!(auth.check_header(Some("Bearer s3cret")));
        assert!(!auth.check_header(Some("Bearer s3cre")));
        assert!(!auth.check_header(Some("Bearer s3cret2")));
        assert!(!auth.check_header(Some("s3cret")));
        assert!(!auth.check_header(None));
        assert!(Auth::new(None).check_header(None));
        assert!(!Auth::new(Some("  ".into())).enabled());
    }
}
