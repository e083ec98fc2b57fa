//! Schedules: a stored job file run on a calendar (a cron expression in a
//! time zone, or an interval), with an overlap policy, a catch-up rule for
//! runs missed while no admin ran, a jitter, and a paused flag; and the
//! pure decisions over them: when the next run is due, which runs were
//! missed between two instants, and what to do now.
//!
//! A run's **slot** is the instant its calendar names, in ms since the
//! epoch: an interval's slots are its multiples since the epoch, a cron
//! expression's are its occurrences in its time zone. The run starts at the
//! slot plus its jitter, an offset below the bound that depends only on the
//! schedule's name and the slot, so that every instance agrees on it. Each
//! slot runs at most once: the last slot run is stored with the run's job.
//!
//! Each schedule is a setting under `schedule/NAME` (JSON), and its last run
//! one under `schedule-run/NAME`, written in the step that submits the run.

use serde::{Deserialize, Serialize};

/// The settings prefix of the schedules.
pub const PREFIX: &str = "schedule/";
/// The settings prefix of each schedule's last run.
pub const RUN_PREFIX: &str = "schedule-run/";

/// The longest a name may be.
const MAX_NAME: usize = 64;
/// The catch-up window when none is given.
const DEFAULT_CATCH_UP_WINDOW_MS: u64 = 3_600_000;
/// How many of a cron calendar's next occurrences the jitter is checked against.
const GAPS_CHECKED: usize = 16;

/// A schedule's terms as an operator gives them (every field text, as on the
/// command line or in JSON); `Schedule::from_terms` checks them.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Terms {
    pub name: String,
    /// `15m`, `1h30m`, or a cron expression of five fields (or `@daily`...).
    pub calendar: String,
    /// The cron expression's IANA time zone (`Europe/Berlin`); UTC when empty.
    pub time_zone: String,
    /// `skip` (the default), `queue_one`, `cancel_running` or `allow`.
    pub overlap: String,
    /// `last` (the default) or `none`.
    pub catch_up: String,
    /// How late a missed run may still be caught up (`1h` when empty).
    pub catch_up_window: String,
    /// The bound of each run's offset (`0` when empty).
    pub jitter: String,
    /// Added paused.
    pub paused: bool,
}

/// What to do when a run is due while the previous one is still active.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Overlap {
    /// The new run is not started.
    Skip,
    /// The new run waits for the previous one to end; at most one waits.
    QueueOne,
    /// The previous run is canceled and the new one started.
    CancelRunning,
    /// The new run starts beside the previous one.
    Allow,
}

/// What becomes of runs that came due while no admin ran.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CatchUp {
    /// None of them runs.
    None,
    /// The last of them runs once, if it is no older than `window_ms`.
    Last { window_ms: u64 },
}

/// When a schedule's runs come due.
#[derive(Clone, Debug)]
pub enum Calendar {
    /// Every `ms`, at its multiples since the epoch.
    Every { ms: u64 },
    /// The occurrences of a cron expression in a time zone.
    Cron { cron: Box<croner::Cron>, zone: chrono_tz::Tz },
}

/// A checked schedule.
#[derive(Clone, Debug)]
pub struct Schedule {
    pub name: String,
    /// The terms it was made from, as given (what is stored and shown).
    pub terms: Terms,
    pub calendar: Calendar,
    pub overlap: Overlap,
    pub catch_up: CatchUp,
    pub jitter_ms: u64,
    /// The job file each run submits, as given.
    pub job_file: String,
    /// Its format: `json`, `toml` or `yaml`.
    pub format: String,
    pub paused: bool,
    /// No slot before this counts: when it was added, or last resumed.
    pub since_ms: i64,
}

/// A schedule as it is stored: its terms, its job file, and its state.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Stored {
    pub terms: Terms,
    pub job_file: String,
    pub format: String,
    pub since_ms: i64,
}

/// A schedule's last run, stored in the step that submits it (or decides
/// not to): no slot at or before `slot` runs again.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LastRun {
    /// The last slot run or decided on; `None` before the first.
    #[serde(default)]
    pub slot: Option<i64>,
    /// The run's job, when one was submitted.
    #[serde(default)]
    pub job: Option<String>,
    /// When it was decided, ms since the epoch.
    pub at_ms: i64,
    /// `started`, `skipped` (its previous run was still active), `queued`
    /// (it waits for its previous run), `run_now` (asked for).
    pub outcome: String,
    /// A run that waits for `job` to end (overlap `queue_one`): its slot.
    #[serde(default)]
    pub queued: Option<i64>,
}

/// What a schedule asks for now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Due {
    /// Nothing before `at` (ms since the epoch); `None`: never (paused,
    /// or a calendar that has no more occurrences).
    Wait { at: Option<i64> },
    /// Run `slot` now: it came due while this admin ran, or (`caught_up`)
    /// it is the last run missed while none ran, within the catch-up window.
    Run { slot: i64, caught_up: bool },
    /// Runs up to `slot` were missed while no admin ran, and catch-up leaves them.
    Missed { slot: i64 },
}

/// A refused schedule: the field, the value and the rule, in one line.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("schedule {field}: {value:?}: {rule}")]
pub struct Error {
    pub field: &'static str,
    pub value: String,
    pub rule: String,
}

fn refuse(field: &'static str, value: &str, rule: impl Into<String>) -> Error {
    Error { field, value: value.to_string(), rule: rule.into() }
}

impl Overlap {
    pub fn parse(text: &str) -> Result<Overlap, Error> {
        match text {
            "" | "skip" => Ok(Overlap::Skip),
            "queue_one" => Ok(Overlap::QueueOne),
            "cancel_running" => Ok(Overlap::CancelRunning),
            "allow" => Ok(Overlap::Allow),
            other => Err(refuse("overlap", other, "use skip, queue_one, cancel_running or allow")),
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Overlap::Skip => "skip",
            Overlap::QueueOne => "queue_one",
            Overlap::CancelRunning => "cancel_running",
            Overlap::Allow => "allow",
        }
    }
}

/// `15m`, `1h30m`, `90s`, `2d`: whole numbers with units s, m, h or d, in ms.
pub fn parse_duration(text: &str) -> Option<u64> {
    let mut total: u64 = 0;
    let mut number: Option<u64> = None;
    if text.is_empty() {
        return None;
    }
    for c in text.chars() {
        if let Some(digit) = c.to_digit(10) {
            number = Some(number.unwrap_or(0).checked_mul(10)?.checked_add(u64::from(digit))?);
            continue;
        }
        let unit: u64 = match c {
            's' => 1_000,
            'm' => 60_000,
            'h' => 3_600_000,
            'd' => 86_400_000,
            _ => return None,
        };
        total = total.checked_add(number.take()?.checked_mul(unit)?)?;
    }
    match number {
        // A bare number is seconds only when it is the whole text.
        Some(n) if total == 0 && text.chars().all(|c| c.is_ascii_digit()) => n.checked_mul(1_000),
        Some(_) => None,
        None => Some(total),
    }
}

/// The fields of a five-field cron expression, with their ranges.
const CRON_FIELDS: [(&str, u32, u32); 5] =
    [("minute", 0, 59), ("hour", 0, 23), ("day of month", 1, 31), ("month", 1, 12), ("day of week", 0, 7)];

/// Checks the numbers of each field of a cron expression against its
/// range, naming the field: croner's own messages do not.
fn check_cron_fields(expression: &str) -> Result<(), String> {
    if expression.trim_start().starts_with('@') {
        return Ok(());
    }
    let fields: Vec<&str> = expression.split_whitespace().collect();
    if fields.len() != CRON_FIELDS.len() {
        return Err(format!(
            "a cron calendar has 5 fields (minute hour day-of-month month day-of-week), this has {}",
            fields.len()
        ));
    }
    for (field, (name, low, high)) in fields.iter().zip(CRON_FIELDS) {
        for item in field.split(',') {
            let (range, step) = item.split_once('/').unwrap_or((item, ""));
            if !step.is_empty() && step.parse::<u32>().map_or(true, |s| s == 0) {
                return Err(format!("{name} step {step:?} is not a whole number from 1"));
            }
            for bound in range.split('-') {
                // Names (JAN, MON) and modifiers (L, W, #) are croner's to judge.
                let Ok(value) = bound.parse::<u32>() else { continue };
                if value < low || value > high {
                    return Err(format!("{name} {value} is out of range {low}..{high}"));
                }
            }
        }
    }
    Ok(())
}

fn parse_cron(expression: &str) -> Result<croner::Cron, String> {
    check_cron_fields(expression)?;
    croner::parser::CronParser::builder()
        .seconds(croner::parser::Seconds::Disallowed)
        .year(croner::parser::Year::Disallowed)
        .build()
        .parse(expression)
        .map_err(|e| {
            let text = e.to_string();
            let text = text.trim_end_matches('.');
            let mut chars = text.chars();
            chars.next().map(|c| c.to_lowercase().chain(chars).collect()).unwrap_or_default()
        })
}

impl Calendar {
    fn parse(calendar: &str, time_zone: &str) -> Result<Calendar, Error> {
        let calendar = calendar.trim();
        if calendar.is_empty() {
            return Err(refuse("calendar", calendar, "required: an interval such as 15m, or a cron expression"));
        }
        if calendar.starts_with(|c: char| c.is_ascii_digit()) && !calendar.contains(char::is_whitespace) {
            let ms = parse_duration(calendar).ok_or_else(|| {
                refuse(
                    "calendar",
                    calendar,
                    "an interval is whole numbers with units s, m, h or d, such as 15m or 1h30m",
                )
            })?;
            if ms < 1_000 {
                return Err(refuse("calendar", calendar, "an interval is at least 1s"));
            }
            if !time_zone.is_empty() {
                return Err(refuse("time_zone", time_zone, "applies to a cron calendar, not to an interval"));
            }
            return Ok(Calendar::Every { ms });
        }
        let zone = match time_zone {
            "" => chrono_tz::Tz::UTC,
            name => name.parse::<chrono_tz::Tz>().map_err(|_| {
                refuse("time_zone", name, "unknown time zone: use an IANA name such as Europe/Berlin, or UTC")
            })?,
        };
        let cron = parse_cron(calendar).map_err(|rule| refuse("calendar", calendar, rule))?;
        Ok(Calendar::Cron { cron: Box::new(cron), zone })
    }

    /// The latest slot at or before `t`.
    pub fn at_or_before(&self, t: i64) -> Option<i64> {
        match self {
            Calendar::Every { ms } => {
                let ms = i64::try_from(*ms).ok()?;
                Some(t.div_euclid(ms) * ms)
            }
            Calendar::Cron { cron, zone } => {
                let at = instant(t, zone)?;
                let found = cron.find_previous_occurrence(&at, true).ok()?;
                Some(found.timestamp_millis())
            }
        }
    }

    /// The first slot after `t`.
    pub fn after(&self, t: i64) -> Option<i64> {
        match self {
            Calendar::Every { ms } => {
                let ms = i64::try_from(*ms).ok()?;
                Some((t.div_euclid(ms) + 1) * ms)
            }
            Calendar::Cron { cron, zone } => {
                let at = instant(t, zone)?;
                let found = cron.find_next_occurrence(&at, false).ok()?;
                // Occurrences are whole seconds: one found within the same second is past.
                let found = found.timestamp_millis();
                if found > t {
                    Some(found)
                } else {
                    let next = instant(t.div_euclid(1000) * 1000 + 1000, zone)?;
                    Some(cron.find_next_occurrence(&next, true).ok()?.timestamp_millis())
                }
            }
        }
    }

    /// The shortest gap between the next occurrences after `t` (an
    /// interval's own); `None` when it has fewer than two.
    fn shortest_gap(&self, t: i64) -> Option<u64> {
        match self {
            Calendar::Every { ms } => Some(*ms),
            Calendar::Cron { .. } => {
                let mut at = self.after(t)?;
                let mut shortest: Option<u64> = None;
                for _ in 0..GAPS_CHECKED {
                    let Some(next) = self.after(at) else { break };
                    let gap = u64::try_from(next - at).unwrap_or(0);
                    shortest = Some(shortest.map_or(gap, |s| s.min(gap)));
                    at = next;
                }
                shortest
            }
        }
    }
}

/// `t` (ms since the epoch) in `zone`, to the second below.
fn instant(t: i64, zone: &chrono_tz::Tz) -> Option<chrono::DateTime<chrono_tz::Tz>> {
    use chrono::TimeZone;
    zone.timestamp_millis_opt(t.div_euclid(1000) * 1000).single()
}

/// FNV-1a: a hash that every build and every instance computes alike.
fn stable_hash(bytes: impl IntoIterator<Item = u8>) -> u64 {
    bytes.into_iter().fold(0xcbf2_9ce4_8422_2325, |hash, byte| (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3))
}

/// Checks a schedule's name: the key it is stored and reached under.
pub fn check_name(name: &str) -> Result<(), Error> {
    if name.is_empty() || name.len() > MAX_NAME {
        return Err(refuse("name", name, format!("1 to {MAX_NAME} characters")));
    }
    if !name.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.')) || name.starts_with('.') {
        return Err(refuse("name", name, "letters, digits, '-', '_' and '.' only, not starting with '.'"));
    }
    Ok(())
}

impl Schedule {
    /// Checks terms given at `now`; the job file is the caller's to check.
    pub fn from_terms(terms: Terms, job_file: String, format: String, now: i64) -> Result<Schedule, Error> {
        let stored = Stored { terms, job_file, format, since_ms: now };
        let schedule = Schedule::from_stored(stored)?;
        if schedule.calendar.after(now).is_none() {
            return Err(refuse("calendar", &schedule.terms.calendar, "never comes due"));
        }
        if schedule.jitter_ms > 0 {
            if let Some(gap) = schedule.calendar.shortest_gap(now) {
                if schedule.jitter_ms >= gap {
                    return Err(refuse(
                        "jitter",
                        &schedule.terms.jitter,
                        format!("must be less than the shortest gap between runs ({} s)", gap / 1000),
                    ));
                }
            }
        }
        Ok(schedule)
    }

    /// A stored schedule, checked again.
    pub fn from_stored(stored: Stored) -> Result<Schedule, Error> {
        let Stored { terms, job_file, format, since_ms } = stored;
        check_name(&terms.name)?;
        let calendar = Calendar::parse(&terms.calendar, &terms.time_zone)?;
        let overlap = Overlap::parse(&terms.overlap)?;
        let window_ms = match terms.catch_up_window.as_str() {
            "" => DEFAULT_CATCH_UP_WINDOW_MS,
            text => parse_duration(text).ok_or_else(|| {
                refuse("catch_up_window", text, "a duration: whole numbers with units s, m, h or d, such as 1h")
            })?,
        };
        let catch_up = match terms.catch_up.as_str() {
            "" | "last" => CatchUp::Last { window_ms },
            "none" if terms.catch_up_window.is_empty() => CatchUp::None,
            "none" => return Err(refuse("catch_up_window", &terms.catch_up_window, "applies to catch_up last only")),
            other => return Err(refuse("catch_up", other, "use last (run the last missed run once) or none")),
        };
        let jitter_ms = match terms.jitter.as_str() {
            "" => 0,
            text => parse_duration(text).ok_or_else(|| {
                refuse("jitter", text, "a duration: whole numbers with units s, m, h or d, such as 30s")
            })?,
        };
        let format = match format.as_str() {
            "" => "json".to_string(),
            "json" | "toml" | "yaml" => format,
            "yml" => "yaml".to_string(),
            other => return Err(refuse("format", other, "use json, toml or yaml")),
        };
        Ok(Schedule {
            name: terms.name.clone(),
            paused: terms.paused,
            terms,
            calendar,
            overlap,
            catch_up,
            jitter_ms,
            job_file,
            format,
            since_ms,
        })
    }

    pub fn stored(&self) -> Stored {
        let mut terms = self.terms.clone();
        terms.paused = self.paused;
        Stored { terms, job_file: self.job_file.clone(), format: self.format.clone(), since_ms: self.since_ms }
    }

    /// The offset of `slot`'s run: below the jitter bound, the same on every instance.
    pub fn jitter_of(&self, slot: i64) -> i64 {
        if self.jitter_ms == 0 {
            return 0;
        }
        let hash = stable_hash(self.name.bytes().chain(slot.to_le_bytes()));
        i64::try_from(hash % self.jitter_ms).unwrap_or(0)
    }

    /// When `slot`'s run starts.
    pub fn start_of(&self, slot: i64) -> i64 {
        slot.saturating_add(self.jitter_of(slot))
    }

    /// The latest slot whose run has started by `now`.
    fn latest_started(&self, now: i64) -> Option<i64> {
        let slot = self.calendar.at_or_before(now)?;
        if self.start_of(slot) <= now {
            return Some(slot);
        }
        // Its jitter puts it later: the slot before, if that one has started.
        let before = self.calendar.at_or_before(slot - 1)?;
        (self.start_of(before) <= now).then_some(before)
    }

    /// The first slot after `last` (and at or after `since_ms`).
    fn first_after(&self, last: Option<i64>) -> Option<i64> {
        let floor = last.map_or(self.since_ms - 1, |l| l.max(self.since_ms - 1));
        self.calendar.after(floor)
    }

    /// When the next run starts, after the last slot run (or decided on).
    pub fn next_start(&self, last: Option<i64>) -> Option<i64> {
        if self.paused {
            return None;
        }
        self.first_after(last).map(|slot| self.start_of(slot))
    }

    /// What to do at `now`, the last slot run (or decided on) being `last`,
    /// and this admin running since `up_since`: a slot whose run started
    /// before that came due while no admin ran (as far as this one knows),
    /// and is caught up or missed as the schedule says.
    pub fn due(&self, last: Option<i64>, up_since: i64, now: i64) -> Due {
        if self.paused {
            return Due::Wait { at: None };
        }
        let latest = self.latest_started(now).filter(|s| *s >= self.since_ms && last.is_none_or(|l| *s > l));
        let Some(slot) = latest else {
            return Due::Wait { at: self.next_start(last) };
        };
        let starts = self.start_of(slot);
        if starts >= up_since {
            return Due::Run { slot, caught_up: false };
        }
        match self.catch_up {
            CatchUp::Last { window_ms } if now - starts <= i64::try_from(window_ms).unwrap_or(i64::MAX) => {
                Due::Run { slot, caught_up: true }
            }
            _ => Due::Missed { slot },
        }
    }

    /// The slots after `from` up to `to` (both ms since the epoch), at most `limit` of them.
    pub fn slots_between(&self, from: i64, to: i64, limit: usize) -> Vec<i64> {
        let mut slots = Vec::new();
        let mut at = from;
        while slots.len() < limit {
            match self.calendar.after(at) {
                Some(slot) if slot <= to => {
                    slots.push(slot);
                    at = slot;
                }
                _ => break,
            }
        }
        slots
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MINUTE: i64 = 60_000;
    const HOUR: i64 = 60 * MINUTE;

    fn terms(calendar: &str) -> Terms {
        Terms { name: "nightly".into(), calendar: calendar.into(), ..Terms::default() }
    }

    fn check(terms: Terms) -> Result<Schedule, String> {
        Schedule::from_terms(terms, "{}".into(), "json".into(), 0).map_err(|e| e.to_string())
    }

    /// ms since the epoch of a UTC time written `2026-03-29T01:30:00`.
    fn utc(text: &str) -> i64 {
        chrono::NaiveDateTime::parse_from_str(text, "%Y-%m-%dT%H:%M:%S").unwrap().and_utc().timestamp_millis()
    }

    #[test]
    fn bad_terms_are_refused_naming_the_field_and_the_rule() {
        let cases = [
            (terms("61 * * * *"), r#"schedule calendar: "61 * * * *": minute 61 is out of range 0..59"#),
            (terms("0 24 * * *"), r#"schedule calendar: "0 24 * * *": hour 24 is out of range 0..23"#),
            (terms("0 0 0 * *"), r#"schedule calendar: "0 0 0 * *": day of month 0 is out of range 1..31"#),
            (
                terms("* * * *"),
                r#"schedule calendar: "* * * *": a cron calendar has 5 fields (minute hour day-of-month month day-of-week), this has 4"#,
            ),
            (terms("0 0 30 2 *"), r#"schedule calendar: "0 0 30 2 *": never comes due"#),
            (
                terms("15x"),
                r#"schedule calendar: "15x": an interval is whole numbers with units s, m, h or d, such as 15m or 1h30m"#,
            ),
            (terms(""), r#"schedule calendar: "": required: an interval such as 15m, or a cron expression"#),
            (
                Terms { time_zone: "Mars/Olympus".into(), ..terms("0 3 * * *") },
                r#"schedule time_zone: "Mars/Olympus": unknown time zone: use an IANA name such as Europe/Berlin, or UTC"#,
            ),
            (
                Terms { time_zone: "UTC".into(), ..terms("15m") },
                r#"schedule time_zone: "UTC": applies to a cron calendar, not to an interval"#,
            ),
            (
                Terms { overlap: "sometimes".into(), ..terms("15m") },
                r#"schedule overlap: "sometimes": use skip, queue_one, cancel_running or allow"#,
            ),
            (
                Terms { catch_up: "all".into(), ..terms("15m") },
                r#"schedule catch_up: "all": use last (run the last missed run once) or none"#,
            ),
            (
                Terms { jitter: "15m".into(), ..terms("15m") },
                r#"schedule jitter: "15m": must be less than the shortest gap between runs (900 s)"#,
            ),
            (
                Terms { name: "a/b".into(), ..terms("15m") },
                r#"schedule name: "a/b": letters, digits, '-', '_' and '.' only, not starting with '.'"#,
            ),
        ];
        for (terms, expected) in cases {
            assert_eq!(check(terms).unwrap_err(), expected);
        }
        assert!(check(terms("*/5 * * * mon-fri")).is_ok());
        assert!(check(terms("@daily")).is_ok());
        assert!(check(Terms { jitter: "30s".into(), overlap: "queue_one".into(), ..terms("1h30m") }).is_ok());
    }

    #[test]
    fn durations_are_whole_numbers_with_units() {
        assert_eq!(parse_duration("15m"), Some(900_000));
        assert_eq!(parse_duration("1h30m"), Some(5_400_000));
        assert_eq!(parse_duration("2d"), Some(172_800_000));
        assert_eq!(parse_duration("45"), Some(45_000));
        for bad in ["", "m", "1.5h", "10ms", "1h30", "-1s"] {
            assert_eq!(parse_duration(bad), None, "{bad}");
        }
    }

    #[test]
    fn an_interval_comes_due_at_its_multiples_and_the_next_start_follows_the_last_run() {
        let every = check(terms("15m")).unwrap();
        let at = utc("2026-05-01T10:07:00");
        assert_eq!(every.calendar.at_or_before(at), Some(utc("2026-05-01T10:00:00")));
        assert_eq!(every.calendar.after(at), Some(utc("2026-05-01T10:15:00")));
        assert_eq!(every.calendar.after(utc("2026-05-01T10:15:00")), Some(utc("2026-05-01T10:30:00")));
        assert_eq!(every.next_start(Some(utc("2026-05-01T10:15:00"))), Some(utc("2026-05-01T10:30:00")));
    }

    #[test]
    fn a_run_is_due_once_per_slot_and_missed_runs_are_caught_up_as_the_schedule_says() {
        let every = check(terms("15m")).unwrap();
        let ten = utc("2026-05-01T10:00:00");
        // Up since before 10:00: the 10:00 run is on time, once.
        assert_eq!(every.due(None, ten - MINUTE, ten + 1_000), Due::Run { slot: ten, caught_up: false });
        assert_eq!(every.due(Some(ten), ten - MINUTE, ten + 2_000), Due::Wait { at: Some(ten + 15 * MINUTE) });
        // Down from 10:05 to 10:50: 10:15, 10:30 and 10:45 were missed.
        let up = utc("2026-05-01T10:50:00");
        assert_eq!(every.slots_between(ten, up, 10).len(), 3);
        assert_eq!(every.due(Some(ten), up, up + 10), Due::Run { slot: ten + 45 * MINUTE, caught_up: true });
        let none = Schedule { catch_up: CatchUp::None, ..every.clone() };
        assert_eq!(none.due(Some(ten), up, up + 10), Due::Missed { slot: ten + 45 * MINUTE });
        // Past the window, even `last` leaves it.
        let short = Schedule { catch_up: CatchUp::Last { window_ms: 60_000 }, ..every.clone() };
        assert_eq!(short.due(Some(ten), up, up + 10), Due::Missed { slot: ten + 45 * MINUTE });
        // Paused, nothing; nothing before it was added or resumed.
        assert_eq!(Schedule { paused: true, ..every.clone() }.due(None, 0, up), Due::Wait { at: None });
        let resumed = Schedule { since_ms: ten + MINUTE, ..every.clone() };
        assert_eq!(resumed.due(None, 0, ten + 2 * MINUTE), Due::Wait { at: Some(ten + 15 * MINUTE) });
    }

    #[test]
    fn jitter_is_below_its_bound_the_same_everywhere_and_delays_the_start() {
        let jittered = check(Terms { jitter: "5m".into(), ..terms("15m") }).unwrap();
        let ten = utc("2026-05-01T10:00:00");
        let offsets: Vec<i64> = (0..50).map(|k| jittered.jitter_of(ten + k * 15 * MINUTE)).collect();
        assert!(offsets.iter().all(|o| (0..5 * MINUTE).contains(o)));
        assert!(offsets.iter().collect::<std::collections::BTreeSet<_>>().len() > 40, "offsets spread: {offsets:?}");
        assert_eq!(jittered.clone().jitter_of(ten), jittered.jitter_of(ten));
        let starts = jittered.start_of(ten);
        if starts > ten {
            assert_eq!(jittered.due(Some(ten - 15 * MINUTE), 0, starts - 1), Due::Wait { at: Some(starts) });
        }
        assert_eq!(jittered.due(Some(ten - 15 * MINUTE), 0, starts), Due::Run { slot: ten, caught_up: false });
    }

    /// Every start of `schedule` from `from` to `to`, as UTC texts.
    fn starts(schedule: &Schedule, from: i64, to: i64) -> Vec<String> {
        schedule
            .slots_between(from, to, 100)
            .into_iter()
            .map(|t| chrono::DateTime::from_timestamp_millis(t).unwrap().format("%m-%d %H:%M").to_string())
            .collect()
    }

    #[test]
    fn a_cron_calendar_follows_its_time_zone_across_daylight_saving_changes() {
        // 02:30 in Berlin: on 29 March 2026 the clock goes from 02:00 to
        // 03:00, on 25 October from 03:00 back to 02:00. Each day runs once.
        let berlin = Terms { time_zone: "Europe/Berlin".into(), ..terms("30 2 * * *") };
        let nightly = check(berlin).unwrap();
        let spring = starts(&nightly, utc("2026-03-27T12:00:00"), utc("2026-03-30T12:00:00"));
        // CET is UTC+1, CEST UTC+2; the missing 02:30 runs at the first instant after the gap.
        assert_eq!(spring, ["03-28 01:30", "03-29 01:00", "03-30 00:30"]);
        let autumn = starts(&nightly, utc("2026-10-23T12:00:00"), utc("2026-10-26T12:00:00"));
        // The repeated 02:30 runs once, at its first occurrence.
        assert_eq!(autumn, ["10-24 00:30", "10-25 00:30", "10-26 01:30"]);
        // A calendar that runs every hour runs 23 times on the short day and 25 on the long one.
        let hourly = check(Terms { time_zone: "Europe/Berlin".into(), ..terms("0 * * * *") }).unwrap();
        assert_eq!(hourly.slots_between(utc("2026-03-28T23:00:00") - 1, utc("2026-03-29T22:00:00") - 1, 100).len(), 23);
        assert_eq!(hourly.slots_between(utc("2026-10-24T22:00:00") - 1, utc("2026-10-25T23:00:00") - 1, 100).len(), 25);
        // The next run after a slot in the repeated hour is the next day's.
        let first = utc("2026-10-25T00:30:00");
        assert_eq!(nightly.calendar.after(first), Some(utc("2026-10-26T01:30:00")));
        assert_eq!(nightly.calendar.at_or_before(first + HOUR + 1), Some(first));
    }

    #[test]
    fn a_stored_schedule_reads_back_as_it_was() {
        let schedule = check(Terms { catch_up: "none".into(), paused: true, ..terms("0 3 * * *") }).unwrap();
        let bytes = serde_json::to_vec(&schedule.stored()).unwrap();
        let back = Schedule::from_stored(serde_json::from_slice(&bytes).unwrap()).unwrap();
        assert_eq!((back.stored(), back.paused, back.catch_up), (schedule.stored(), true, CatchUp::None));
    }
}
