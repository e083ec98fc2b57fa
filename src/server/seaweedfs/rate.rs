//! A budgeted task's share of the bandwidth budget where a worker reads it:
//! the parameter `io_byte_per_second` (which SeaweedFS's parameters-only
//! path reads too) and, for SeaweedFS's workers, the `io_byte_per_second` of the
//! balance and EC balance parameters inside `task_params_pb`, which the
//! worker reads instead whenever the task carries one. A batch of balance
//! moves applies the rate to each move it runs at once: each gets its part.
//! The bytes are changed field by field, so that every field jobcenter does
//! not know is kept as it was.

use std::collections::BTreeMap;

use prost::Message;

use crate::proto::plugin::{config_value::Kind, ConfigValue};
use crate::proto::worker::{task_params, TaskParams};

/// The parameter a task's share comes in, and the one that carries SeaweedFS's `TaskParams`.
const RATE: &str = crate::budget::PARAMETER;
const TASK_PARAMS: &str = "task_params_pb";

/// `TaskParams` fields: the balance and EC balance parameters, and the
/// range of its `task_params` oneof.
const BALANCE_PARAMS: u32 = 11;
const EC_BALANCE_PARAMS: u32 = 13;
const ONEOF: std::ops::RangeInclusive<u32> = 9..=14;
/// Where each keeps its rate.
const BALANCE_RATE: u32 = 5;
const EC_BALANCE_RATE: u32 = 6;
/// How many moves of a batch SeaweedFS's balance runs at once when the
/// batch does not say.
const DEFAULT_CONCURRENT_MOVES: usize = 5;

/// Puts a task's share into its parameters: as `io_byte_per_second`, and
/// into their `task_params_pb` for the job types whose parameters have a
/// rate there (left as it is when the bytes cannot be read).
pub(crate) fn apply(job_type: &str, share: u64, parameters: &mut BTreeMap<String, ConfigValue>) {
    let rate = i64::try_from(share).unwrap_or(i64::MAX);
    parameters.insert(RATE.to_string(), ConfigValue { kind: Some(Kind::Int64Value(rate)) });
    let Some(Kind::BytesValue(bytes)) = parameters.get_mut(TASK_PARAMS).and_then(|v| v.kind.as_mut()) else {
        return;
    };
    if let Some(rewritten) = with_rate(job_type, bytes, share) {
        *bytes = rewritten;
    }
}

/// `TaskParams` bytes with the rate of their balance or EC balance
/// parameters set from `share`; `None` to leave them as they are.
fn with_rate(job_type: &str, bytes: &[u8], share: u64) -> Option<Vec<u8>> {
    let (field, rate_field, rate) = match job_type {
        "volume_balance" => {
            let params = TaskParams::decode(bytes).ok()?;
            let moves = match params.task_params {
                Some(task_params::TaskParams::BalanceParams(balance)) if balance.moves.len() > 1 => {
                    let concurrent = usize::try_from(balance.max_concurrent_moves).unwrap_or(0);
                    let concurrent = if concurrent == 0 { DEFAULT_CONCURRENT_MOVES } else { concurrent };
                    concurrent.min(balance.moves.len())
                }
                _ => 1,
            };
            (BALANCE_PARAMS, BALANCE_RATE, share / moves as u64)
        }
        "ec_balance" => (EC_BALANCE_PARAMS, EC_BALANCE_RATE, share),
        _ => return None,
    };
    let fields = fields(bytes)?;
    let present = |wanted: &dyn Fn(u32) -> bool| fields.iter().any(|(number, _, _)| wanted(*number));
    if !present(&|n| n == field) && present(&|n| ONEOF.contains(&n)) {
        // Parameters of another kind: not ours to change.
        return None;
    }
    let mut out = Vec::with_capacity(bytes.len() + 16);
    let mut found = false;
    for (number, wire_type, range) in &fields {
        let raw = &bytes[range.clone()];
        if *number == field && *wire_type == LEN && !found {
            found = true;
            let inner = with_varint(payload(raw)?, rate_field, rate)?;
            put_len(&mut out, field, &inner);
        } else if *number != field {
            out.extend_from_slice(raw);
        }
    }
    if !found {
        let inner = with_varint(&[], rate_field, rate)?;
        put_len(&mut out, field, &inner);
    }
    Some(out)
}

const VARINT: u8 = 0;
const LEN: u8 = 2;

/// A message with every `field` left out and `field = value` (a varint) at its end.
fn with_varint(message: &[u8], field: u32, value: u64) -> Option<Vec<u8>> {
    let mut out: Vec<u8> = Vec::with_capacity(message.len() + 12);
    for (number, _, range) in fields(message)? {
        if number != field {
            out.extend_from_slice(&message[range]);
        }
    }
    put_varint(&mut out, (u64::from(field) << 3) | u64::from(VARINT));
    put_varint(&mut out, value);
    Some(out)
}

/// The top-level fields of a message: number, wire type, and the bytes
/// of each (tag included); `None` when they cannot be read.
fn fields(message: &[u8]) -> Option<Vec<(u32, u8, std::ops::Range<usize>)>> {
    let mut out = Vec::new();
    let mut at = 0;
    while at < message.len() {
        let start = at;
        let tag = read_varint(message, &mut at)?;
        let (number, wire_type) = (u32::try_from(tag >> 3).ok()?, (tag & 7) as u8);
        match wire_type {
            VARINT => {
                read_varint(message, &mut at)?;
            }
            1 => at = at.checked_add(8)?,
            LEN => {
                let len = usize::try_from(read_varint(message, &mut at)?).ok()?;
                at = at.checked_add(len)?;
            }
            5 => at = at.checked_add(4)?,
            _ => return None,
        }
        if at > message.len() || number == 0 {
            return None;
        }
        out.push((number, wire_type, start..at));
    }
    Some(out)
}

/// The payload of a length-delimited field's bytes (tag included).
fn payload(raw: &[u8]) -> Option<&[u8]> {
    let mut at = 0;
    read_varint(raw, &mut at)?;
    read_varint(raw, &mut at)?;
    raw.get(at..)
}

fn read_varint(bytes: &[u8], at: &mut usize) -> Option<u64> {
    let mut value = 0u64;
    for shift in (0..64).step_by(7) {
        let byte = *bytes.get(*at)?;
        *at += 1;
        value |= u64::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            return Some(value);
        }
    }
    None
}

fn put_varint(out: &mut Vec<u8>, mut value: u64) {
    while value >= 0x80 {
        out.push((value as u8) | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

fn put_len(out: &mut Vec<u8>, field: u32, payload: &[u8]) {
    put_varint(out, (u64::from(field) << 3) | u64::from(LEN));
    put_varint(out, payload.len() as u64);
    out.extend_from_slice(payload);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::worker::{BalanceMoveSpec, BalanceTaskParams, EcBalanceTaskParams, TaskSource};

    fn bytes_value(bytes: Vec<u8>) -> ConfigValue {
        ConfigValue { kind: Some(Kind::BytesValue(bytes)) }
    }

    fn applied(job_type: &str, params: &TaskParams, share: u64) -> TaskParams {
        let mut parameters = BTreeMap::from([(TASK_PARAMS.to_string(), bytes_value(params.encode_to_vec()))]);
        apply(job_type, share, &mut parameters);
        let rate = i64::try_from(share).unwrap();
        assert_eq!(parameters[RATE], ConfigValue { kind: Some(Kind::Int64Value(rate)) }, "the loose parameter too");
        let Some(Kind::BytesValue(bytes)) = &parameters[TASK_PARAMS].kind else { panic!("bytes") };
        TaskParams::decode(bytes.as_slice()).unwrap()
    }

    fn balance(params: &TaskParams) -> &BalanceTaskParams {
        match &params.task_params {
            Some(task_params::TaskParams::BalanceParams(balance)) => balance,
            other => panic!("balance parameters, not {other:?}"),
        }
    }

    #[test]
    fn a_balance_move_reads_its_share_and_keeps_everything_else() {
        let single = TaskParams {
            volume_id: 7,
            sources: vec![TaskSource { node: "a:8080".into(), ..Default::default() }],
            task_params: Some(task_params::TaskParams::BalanceParams(BalanceTaskParams {
                timeout_seconds: 600,
                io_byte_per_second: 99,
                ..Default::default()
            })),
            ..Default::default()
        };
        let got = applied("volume_balance", &single, 10_000_000);
        assert_eq!(balance(&got).io_byte_per_second, 10_000_000, "the share replaces the detection's rate");
        assert_eq!((got.volume_id, balance(&got).timeout_seconds), (7, 600));
        assert_eq!(got.sources, single.sources);
        // Without balance parameters, they are added with the rate alone.
        let bare = TaskParams { volume_id: 7, ..Default::default() };
        assert_eq!(balance(&applied("volume_balance", &bare, 5)).io_byte_per_second, 5);
    }

    #[test]
    fn a_batch_of_moves_splits_its_share_between_the_moves_it_runs_at_once() {
        let moves = |n: u32| (0..n).map(|i| BalanceMoveSpec { volume_id: i, ..Default::default() }).collect();
        let batch = |n, concurrent| TaskParams {
            task_params: Some(task_params::TaskParams::BalanceParams(BalanceTaskParams {
                max_concurrent_moves: concurrent,
                moves: moves(n),
                ..Default::default()
            })),
            ..Default::default()
        };
        let rate =
            |n, concurrent| balance(&applied("volume_balance", &batch(n, concurrent), 12_000_000)).io_byte_per_second;
        assert_eq!(rate(8, 3), 4_000_000, "three at once");
        assert_eq!(rate(2, 3), 6_000_000, "no more at once than there are moves");
        assert_eq!(rate(8, 0), 2_400_000, "SeaweedFS runs five at once when the batch does not say");
        assert_eq!(balance(&applied("volume_balance", &batch(8, 3), 12_000_000)).moves.len(), 8);
    }

    #[test]
    fn an_ec_balance_move_reads_its_share_and_other_kinds_are_left_alone() {
        let ec = TaskParams {
            task_params: Some(task_params::TaskParams::EcBalanceParams(EcBalanceTaskParams {
                disk_type: "hdd".into(),
                ..Default::default()
            })),
            ..Default::default()
        };
        match applied("ec_balance", &ec, 3_000_000).task_params {
            Some(task_params::TaskParams::EcBalanceParams(p)) => {
                assert_eq!((p.io_byte_per_second, p.disk_type.as_str()), (3_000_000, "hdd"))
            }
            other => panic!("{other:?}"),
        }
        // Parameters of another kind, or another job type: unchanged.
        let mut vacuum = TaskParams { volume_id: 3, ..Default::default() }.encode_to_vec();
        vacuum.extend([0x4a, 0x02, 0x08, 0x01]); // vacuum_params (9) {force_vacuum: true}
        assert_eq!(with_rate("volume_balance", &vacuum, 5), None);
        assert_eq!(with_rate("erasure_coding", &ec.encode_to_vec(), 5), None);
        let mut parameters = BTreeMap::from([(TASK_PARAMS.to_string(), bytes_value(vacuum.clone()))]);
        apply("volume_balance", 5, &mut parameters);
        assert_eq!(parameters[TASK_PARAMS], bytes_value(vacuum));
        assert_eq!(with_rate("volume_balance", &[0xff], 5), None, "unreadable bytes are left as they are");
    }
}
