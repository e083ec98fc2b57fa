//! How one fuzz input carries several messages: each is a protobuf message
//! prefixed with its length as a varint (prost's length-delimited form), the
//! same framing the seeds are written in. And the placeholder job id, which
//! an input uses to name the job that the target submits for each run.

use prost::Message;

/// Stands for the id of the job submitted for the run, wherever an attempt
/// id names a job (`JOB.TASK_INDEX.ATTEMPT`).
pub const PLACEHOLDER_JOB: &str = "00000000-0000-0000-0000-000000000000";

/// The messages at the start of `data`, at most `most`; decoding stops at
/// the first that is not whole or not valid.
pub fn messages<M: Message + Default>(mut data: &[u8], most: usize) -> Vec<M> {
    let mut out = Vec::new();
    while !data.is_empty() && out.len() < most {
        match M::decode_length_delimited(&mut data) {
            Ok(message) => out.push(message),
            Err(_) => break,
        }
    }
    out
}

/// Each message length-delimited, one after the other.
pub fn encode<M: Message>(messages: &[M]) -> Vec<u8> {
    let mut out = Vec::new();
    for message in messages {
        message.encode_length_delimited(&mut out).expect("a Vec grows");
    }
    out
}

/// `text` with the placeholder job id replaced by `job`.
pub fn with_job(text: &mut String, job: &str) {
    if text.contains(PLACEHOLDER_JOB) {
        *text = text.replace(PLACEHOLDER_JOB, job);
    }
}

/// Decodes `bytes` as `M`, re-encodes it, and checks that the encoding is
/// stable: the value decoded from its own encoding equals it (or, where a
/// NaN keeps it from equalling itself, shows the same through `Debug`), and
/// encodes to as many bytes (maps encode in their iteration order, which
/// two equal maps need not share).
pub fn round_trip<M: Message + Default + PartialEq + std::fmt::Debug>(bytes: &[u8]) -> Option<M> {
    let message = M::decode(bytes).ok()?;
    let encoded = message.encode_to_vec();
    let again = M::decode(&encoded[..]).expect("a message decodes from its own encoding");
    assert!(
        again == message || format!("{again:?}") == format!("{message:?}"),
        "a message decoded from its own encoding differs: {message:?} then {again:?}"
    );
    assert_eq!(again.encode_to_vec().len(), encoded.len(), "a message encodes twice to different lengths");
    Some(message)
}
