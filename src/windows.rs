//! Maintenance windows: when a job type may run, as weekly ranges of local
//! time in named time zones, less blackouts (date-time ranges, or weekly
//! ranges). Pure: parsing, and for an instant, whether a calendar is open
//! and when it next changes. No windows means always open.
//!
//! Local times map to instants by one rule (docs/operations.md, "Maintenance
//! windows"): a local time is read with the UTC offset in force before any
//! daylight-saving change it falls in. In a gap (clocks jump forward) it is
//! thus later by the gap's length (02:30 in Berlin's spring gap is 03:30
//! summer time); in an overlap (clocks go back) it is the first of the two
//! (01:30 before the clocks go back, not after). A day's window whose end
//! would then fall at or before its start (it starts in the gap and ends
//! less than the gap's length later) keeps its usual length from its start.
//! So a window across a change is one span, never two, and never empty.

use std::str::FromStr;

use chrono::{Datelike, Days, NaiveDate, NaiveDateTime, NaiveTime, Offset, TimeZone};
use chrono_tz::Tz;

use crate::clock::Timestamp;

/// How far ahead a calendar is searched for its next change; a calendar
/// that does not open within it is refused.
pub(crate) const HORIZON_DAYS: i64 = 400;

const DAY_MS: i64 = 86_400_000;
const MINUTES_PER_DAY: u32 = 24 * 60;
const DAY_NAMES: [&str; 7] = ["Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun"];

/// A weekly range: on each of `days`, from `start` to `end` (minutes of the
/// day; an end at or before the start is on the next day), in `zone`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Weekly {
    /// A bit per day, Monday the lowest.
    days: u8,
    start: u32,
    /// 1..=1440 (24:00).
    end: u32,
    zone: Tz,
}

/// A blackout: a weekly range, or one range of date and time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Blackout {
    Weekly(Weekly),
    Dates { start: NaiveDateTime, end: NaiveDateTime, zone: Tz },
}

/// A job type's windows and blackouts: open when inside a window (or no
/// window is set) and inside no blackout.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Calendar {
    windows: Vec<Weekly>,
    blackouts: Vec<Blackout>,
}

/// A calendar at an instant: open or not, and when that next changes
/// (`None`: not within `HORIZON_DAYS`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct State {
    pub open: bool,
    pub next_change: Option<Timestamp>,
}

/// What runs when a job type's window closes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum OnClose {
    /// It may end on its own within the grace, then is canceled.
    #[default]
    Drain,
    /// It is canceled at once.
    Cancel,
}

impl OnClose {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            OnClose::Drain => "drain",
            OnClose::Cancel => "cancel",
        }
    }
}

impl FromStr for OnClose {
    type Err = String;
    fn from_str(text: &str) -> Result<OnClose, String> {
        match text {
            "drain" => Ok(OnClose::Drain),
            "cancel" => Ok(OnClose::Cancel),
            _ => Err(format!("{text:?} is not what to do when a window closes; it is drain or cancel")),
        }
    }
}

/// A job type's windows as the engine applies them: when it may run, and
/// what happens to what runs when it closes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Window {
    pub calendar: Calendar,
    pub on_close: OnClose,
    /// How long a drain waits before it cancels; 0: without bound.
    pub grace_seconds: u32,
}

/// The word for "no windows" (always open) and "no blackouts".
pub(crate) const ALWAYS: &str = "always";
pub(crate) const NONE: &str = "none";

/// Reads the `windows` setting: weekly ranges separated by `;`, or `always`.
pub(crate) fn parse_windows(text: &str) -> Result<Calendar, String> {
    let mut calendar = Calendar::default();
    if text.trim() == ALWAYS {
        return Ok(calendar);
    }
    for term in terms(text)? {
        calendar.windows.push(weekly(term).map_err(|problem| format!("{term:?}: {problem}"))?);
    }
    Ok(calendar)
}

/// Reads the `blackouts` setting: date-time ranges
/// (`2026-12-24T00:00..2026-12-27T00:00 Europe/Berlin`) and weekly ranges,
/// separated by `;`, or `none`.
pub(crate) fn parse_blackouts(text: &str) -> Result<Calendar, String> {
    let mut calendar = Calendar::default();
    if text.trim() == NONE {
        return Ok(calendar);
    }
    for term in terms(text)? {
        let blackout = match term.contains("..") {
            true => dates(term).map(|(start, end, zone)| Blackout::Dates { start, end, zone }),
            false => weekly(term).map(Blackout::Weekly),
        };
        calendar.blackouts.push(blackout.map_err(|problem| format!("{term:?}: {problem}"))?);
    }
    Ok(calendar)
}

fn terms(text: &str) -> Result<Vec<&str>, String> {
    let terms: Vec<&str> = text.split(';').map(str::trim).filter(|t| !t.is_empty()).collect();
    if terms.is_empty() {
        return Err("no range given; ranges are separated by ;".into());
    }
    Ok(terms)
}

/// `DAYS HH:MM-HH:MM ZONE`.
fn weekly(term: &str) -> Result<Weekly, String> {
    let words: Vec<&str> = term.split_whitespace().collect();
    let [days_word, times, zone] = words[..] else {
        if let [_, times] = words[..] {
            if times.contains(':') {
                return Err("a time zone is required after the times, e.g. UTC or Europe/Berlin".into());
            }
        }
        return Err("a weekly range is DAYS HH:MM-HH:MM ZONE, e.g. Mon-Fri 22:00-06:00 Europe/Berlin".into());
    };
    let days = days(days_word).ok_or_else(|| format!("{days_word:?} is not a day; days are Mon..Sun"))?;
    let (start, end) =
        times.split_once('-').ok_or_else(|| format!("{times:?} is not a range of times; write HH:MM-HH:MM"))?;
    let start = minute_of_day(start).filter(|m| *m < MINUTES_PER_DAY).ok_or_else(|| not_a_time(start))?;
    let end = minute_of_day(end).ok_or_else(|| not_a_time(end))?;
    if end == start {
        return Err(format!("{times:?} is empty; a whole day is 00:00-24:00"));
    }
    let end = if end == 0 { MINUTES_PER_DAY } else { end };
    Ok(Weekly { days, start, end, zone: zone_of(zone)? })
}

fn not_a_time(text: &str) -> String {
    format!("{text:?} is not a time of day; times are HH:MM from 00:00 to 24:00")
}

/// `Mon`, `Mon-Fri`, `Fri-Mon` (across the week's end), lists of these
/// separated by commas, or `daily`.
fn days(text: &str) -> Option<u8> {
    if text.eq_ignore_ascii_case("daily") {
        return Some(0x7f);
    }
    let mut days = 0u8;
    for part in text.split(',') {
        let (from, to) = part.split_once('-').unwrap_or((part, part));
        let (from, to) = (day(from)?, day(to)?);
        let mut d = from;
        loop {
            days |= 1 << d;
            if d == to {
                break;
            }
            d = (d + 1) % 7;
        }
    }
    Some(days)
}

fn day(text: &str) -> Option<u32> {
    DAY_NAMES.iter().position(|name| name.eq_ignore_ascii_case(text)).map(|i| i as u32)
}

/// `HH:MM`, 00:00 to 24:00.
fn minute_of_day(text: &str) -> Option<u32> {
    let (hours, minutes) = text.split_once(':')?;
    if hours.len() != 2 || minutes.len() != 2 {
        return None;
    }
    let (hours, minutes): (u32, u32) = (hours.parse().ok()?, minutes.parse().ok()?);
    let minute = hours * 60 + minutes;
    (minutes < 60 && minute <= MINUTES_PER_DAY).then_some(minute)
}

fn zone_of(text: &str) -> Result<Tz, String> {
    text.parse::<Tz>()
        .map_err(|_| format!("{text:?} is not a time zone; zones are IANA names such as UTC or Europe/Berlin"))
}

/// `START..END ZONE`, each a `YYYY-MM-DDTHH:MM` or a `YYYY-MM-DD` (midnight).
fn dates(term: &str) -> Result<(NaiveDateTime, NaiveDateTime, Tz), String> {
    let words: Vec<&str> = term.split_whitespace().collect();
    let [range, zone] = words[..] else {
        return Err(
            "a blackout is START..END ZONE, e.g. 2026-12-24T00:00..2026-12-27T00:00 Europe/Berlin, or a weekly range"
                .into(),
        );
    };
    let (start, end) = range.split_once("..").expect("a range");
    let (start, end) = (date_time(start)?, date_time(end)?);
    if end <= start {
        return Err(format!("{range:?} ends before it starts"));
    }
    Ok((start, end, zone_of(zone)?))
}

fn date_time(text: &str) -> Result<NaiveDateTime, String> {
    NaiveDateTime::parse_from_str(text, "%Y-%m-%dT%H:%M")
        .or_else(|_| NaiveDate::parse_from_str(text, "%Y-%m-%d").map(|d| d.and_time(NaiveTime::MIN)))
        .map_err(|_| format!("{text:?} is not a date and time; write YYYY-MM-DDTHH:MM, or YYYY-MM-DD for midnight"))
}

/// The instant of a local time in `zone`, by the rule in the module's doc.
fn instant(zone: Tz, local: NaiveDateTime) -> i64 {
    match zone.from_local_datetime(&local) {
        chrono::LocalResult::Single(at) | chrono::LocalResult::Ambiguous(at, _) => at.timestamp_millis(),
        chrono::LocalResult::None => {
            // In a gap: the offset in force a day before, before the change.
            let before = zone.offset_from_utc_datetime(&(local - chrono::Duration::days(1))).fix();
            (local - chrono::Duration::seconds(i64::from(before.local_minus_utc()))).and_utc().timestamp_millis()
        }
    }
}

/// The local date of an instant in `zone`.
fn local_date(zone: Tz, at: i64) -> NaiveDate {
    let utc = chrono::DateTime::from_timestamp_millis(at).unwrap_or_default();
    zone.from_utc_datetime(&utc.naive_utc()).date_naive()
}

impl Weekly {
    /// The span of the range that starts on local date `date`, if it is one of its days.
    fn on(&self, date: NaiveDate) -> Option<(i64, i64)> {
        if self.days & (1 << date.weekday().num_days_from_monday()) == 0 {
            return None;
        }
        let start = date.and_time(NaiveTime::MIN) + chrono::Duration::minutes(i64::from(self.start));
        let length = match self.end > self.start {
            true => self.end - self.start,
            false => self.end + MINUTES_PER_DAY - self.start,
        };
        let end = start + chrono::Duration::minutes(i64::from(length));
        let (from, to) = (instant(self.zone, start), instant(self.zone, end));
        Some((from, if to > from { to } else { from + i64::from(length) * 60_000 }))
    }

    /// The local dates whose spans may reach `at`.
    fn dates_around(&self, at: i64) -> impl Iterator<Item = NaiveDate> {
        let date = local_date(self.zone, at);
        (0..3).rev().filter_map(move |back| date.checked_sub_days(Days::new(back)))
    }

    fn contains(&self, at: i64) -> bool {
        self.dates_around(at).filter_map(|date| self.on(date)).any(|(from, to)| from <= at && at < to)
    }

    /// The starts and ends of its spans that may fall in `from..=to`.
    fn bounds(&self, from: i64, to: i64, out: &mut Vec<i64>) {
        let (first, last) = (local_date(self.zone, from), local_date(self.zone, to));
        let first = first.checked_sub_days(Days::new(2)).unwrap_or(first);
        for date in first.iter_days().take_while(|date| *date <= last) {
            out.extend(self.on(date).into_iter().flat_map(|(start, end)| [start, end]));
        }
    }
}

impl Blackout {
    fn contains(&self, at: i64) -> bool {
        match self {
            Blackout::Weekly(weekly) => weekly.contains(at),
            Blackout::Dates { start, end, zone } => instant(*zone, *start) <= at && at < instant(*zone, *end),
        }
    }

    fn bounds(&self, from: i64, to: i64, out: &mut Vec<i64>) {
        match self {
            Blackout::Weekly(weekly) => weekly.bounds(from, to, out),
            Blackout::Dates { start, end, zone } => out.extend([instant(*zone, *start), instant(*zone, *end)]),
        }
    }
}

impl Calendar {
    /// The windows of `windows` with the blackouts of `blackouts`.
    pub(crate) fn with_blackouts(windows: Calendar, blackouts: Calendar) -> Calendar {
        Calendar { windows: windows.windows, blackouts: blackouts.blackouts }
    }

    /// No windows and no blackouts: always open.
    pub(crate) fn is_always(&self) -> bool {
        self.windows.is_empty() && self.blackouts.is_empty()
    }

    /// The time zone of its first range, to show its times in.
    pub(crate) fn zone(&self) -> Option<Tz> {
        self.windows.first().map(|w| w.zone).or_else(|| {
            self.blackouts.first().map(|b| match b {
                Blackout::Weekly(w) => w.zone,
                Blackout::Dates { zone, .. } => *zone,
            })
        })
    }

    pub(crate) fn is_open(&self, at: Timestamp) -> bool {
        let at = at.as_millis();
        (self.windows.is_empty() || self.windows.iter().any(|w| w.contains(at)))
            && !self.blackouts.iter().any(|b| b.contains(at))
    }

    /// Whether it is open at `at`, and when that next changes.
    pub(crate) fn state(&self, at: Timestamp) -> State {
        let open = self.is_open(at);
        if self.is_always() {
            return State { open, next_change: None };
        }
        let (start, horizon) = (at.as_millis(), at.as_millis().saturating_add(HORIZON_DAYS * DAY_MS));
        let mut from = start;
        let mut bounds = Vec::new();
        while from < horizon {
            let to = from.saturating_add(7 * DAY_MS).min(horizon);
            bounds.clear();
            for window in &self.windows {
                window.bounds(from, to, &mut bounds);
            }
            for blackout in &self.blackouts {
                blackout.bounds(from, to, &mut bounds);
            }
            // Each chunk is `from` (checked already) exclusive to `to` inclusive.
            bounds.retain(|b| *b > from && *b <= to);
            bounds.sort_unstable();
            bounds.dedup();
            if let Some(change) = bounds.iter().find(|b| self.is_open(Timestamp(**b)) != open) {
                return State { open, next_change: Some(Timestamp(*change)) };
            }
            from = to;
        }
        State { open, next_change: None }
    }

    /// When it next opens at or after `at`, within the horizon: `at` itself if open.
    pub(crate) fn next_open(&self, at: Timestamp) -> Option<Timestamp> {
        let state = self.state(at);
        if state.open {
            return Some(at);
        }
        state.next_change
    }
}

/// An instant as a local time of `zone`, for people: `2026-03-29 03:30 CEST`.
pub(crate) fn local_text(zone: Tz, at: Timestamp) -> String {
    let utc = chrono::DateTime::from_timestamp_millis(at.as_millis()).unwrap_or_default();
    utc.with_timezone(&zone).format("%Y-%m-%d %H:%M %Z").to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(zone: &str, local: &str) -> Timestamp {
        let zone: Tz = zone.parse().unwrap();
        let local = NaiveDateTime::parse_from_str(local, "%Y-%m-%d %H:%M").unwrap();
        Timestamp(zone.from_local_datetime(&local).earliest().unwrap().timestamp_millis())
    }

    fn utc(text: &str) -> Timestamp {
        at("UTC", text)
    }

    #[test]
    fn a_weekly_range_opens_on_its_days_and_runs_past_midnight() {
        let calendar = parse_windows("Mon-Fri 22:00-06:00 UTC").unwrap();
        // 2026-11-30 is a Monday.
        let monday_noon = utc("2026-11-30 12:00");
        assert_eq!(calendar.state(monday_noon), State { open: false, next_change: Some(utc("2026-11-30 22:00")) });
        assert_eq!(
            calendar.state(utc("2026-12-01 05:59")),
            State { open: true, next_change: Some(utc("2026-12-01 06:00")) }
        );
        // Friday night runs into Saturday; Saturday night does not open.
        assert_eq!(
            calendar.state(utc("2026-12-05 03:00")),
            State { open: true, next_change: Some(utc("2026-12-05 06:00")) }
        );
        assert_eq!(
            calendar.state(utc("2026-12-05 23:00")),
            State { open: false, next_change: Some(utc("2026-12-07 22:00")) }
        );
    }

    #[test]
    fn adjacent_ranges_make_one_span_and_always_is_always() {
        let calendar = parse_windows("daily 00:00-24:00 UTC").unwrap();
        assert_eq!(calendar.state(utc("2026-11-30 12:00")), State { open: true, next_change: None });
        let calendar = parse_windows("Sat,Sun 00:00-24:00 Europe/Berlin; Fri 18:00-24:00 Europe/Berlin").unwrap();
        let friday = at("Europe/Berlin", "2026-12-04 19:00");
        assert_eq!(calendar.state(friday).next_change, Some(at("Europe/Berlin", "2026-12-07 00:00")));
        assert_eq!(parse_windows("always").unwrap().state(friday), State { open: true, next_change: None });
        // Days across the week's end.
        let calendar = parse_windows("Fri-Mon 10:00-11:00 UTC").unwrap();
        assert!(calendar.is_open(utc("2026-11-30 10:30")) && !calendar.is_open(utc("2026-12-01 10:30")));
    }

    #[test]
    fn blackouts_close_what_the_windows_open() {
        let windows = parse_windows("daily 22:00-06:00 Europe/Berlin").unwrap();
        let blackouts =
            parse_blackouts("2026-12-24T00:00..2026-12-27T00:00 Europe/Berlin; Mon 00:00-04:00 Europe/Berlin").unwrap();
        let calendar = Calendar::with_blackouts(windows, blackouts);
        let berlin = |t| at("Europe/Berlin", t);
        assert_eq!(
            calendar.state(berlin("2026-12-23 23:00")),
            State { open: true, next_change: Some(berlin("2026-12-24 00:00")) }
        );
        assert_eq!(
            calendar.state(berlin("2026-12-24 00:00")),
            State { open: false, next_change: Some(berlin("2026-12-27 00:00")) }
        );
        // The Monday backup: Sunday night's window closes at midnight and opens at 04:00.
        assert_eq!(
            calendar.state(berlin("2026-12-27 23:00")),
            State { open: true, next_change: Some(berlin("2026-12-28 00:00")) }
        );
        assert_eq!(
            calendar.state(berlin("2026-12-28 01:00")),
            State { open: false, next_change: Some(berlin("2026-12-28 04:00")) }
        );
        // Blackouts alone close only themselves.
        let calendar =
            Calendar::with_blackouts(Calendar::default(), parse_blackouts("2026-12-24..2026-12-25 UTC").unwrap());
        assert_eq!(
            calendar.state(utc("2026-12-01 00:00")),
            State { open: true, next_change: Some(utc("2026-12-24 00:00")) }
        );
        assert_eq!(calendar.state(utc("2026-12-25 00:00")), State { open: true, next_change: None });
    }

    #[test]
    fn a_calendar_that_never_opens_has_no_next_open() {
        let calendar = Calendar::with_blackouts(
            parse_windows("Mon-Fri 22:00-06:00 UTC").unwrap(),
            parse_blackouts("daily 00:00-24:00 UTC").unwrap(),
        );
        assert_eq!(calendar.next_open(utc("2026-11-30 12:00")), None);
        let calendar = Calendar::with_blackouts(
            parse_windows("Mon 01:00-02:00 UTC").unwrap(),
            parse_blackouts("2026-01-01..2029-01-01 UTC").unwrap(),
        );
        assert_eq!(calendar.next_open(utc("2026-11-30 12:00")), None, "past the horizon");
        assert_eq!(calendar.next_open(utc("2028-12-01 12:00")), Some(utc("2029-01-01 01:00")));
    }

    /// The two changes of a year in one zone: the spring gap and the autumn
    /// overlap, a night window across each, and windows in the hour itself.
    /// `spring`: the day of the gap, which skips the hour from 02:00 to
    /// 03:00 (to `summer` time); `autumn`: the day whose hour from
    /// `repeated_hour` comes twice.
    fn both_changes(zone: &str, spring: &str, summer: &str, autumn: &str, repeated_hour: u32) {
        let local = |t: &str| at(zone, t);
        let hours = |a: Timestamp, b: Timestamp| (b.as_millis() - a.as_millis()) as f64 / 3_600_000.0;
        let night = parse_windows(&format!("daily 22:00-06:00 {zone}")).unwrap();
        // Across the spring change: one span of 7 hours, closing at 06:00 local.
        let evening = local(&format!("{spring} 21:00"));
        let prev = |d: &str| {
            NaiveDate::parse_from_str(d, "%Y-%m-%d").unwrap().pred_opt().unwrap().format("%Y-%m-%d").to_string()
        };
        let before_spring = local(&format!("{} 23:00", prev(spring)));
        let state = night.state(before_spring);
        assert!(state.open);
        let closes = state.next_change.unwrap();
        assert_eq!(closes, local(&format!("{spring} 06:00")));
        assert_eq!(hours(local(&format!("{} 22:00", prev(spring))), closes), 7.0, "{zone}: spring night");
        assert_eq!(night.state(closes).next_change, Some(local(&format!("{spring} 22:00"))));
        assert!(!night.is_open(evening));
        // Across the autumn change: one span of 9 hours, never two.
        let before_autumn = local(&format!("{} 23:00", prev(autumn)));
        let state = night.state(before_autumn);
        assert!(state.open);
        assert_eq!(state.next_change, Some(local(&format!("{autumn} 06:00"))));
        assert_eq!(
            hours(local(&format!("{} 22:00", prev(autumn))), state.next_change.unwrap()),
            9.0,
            "{zone}: autumn night"
        );

        // A window in the skipped hour keeps its length, moved later by the gap.
        let h = 2;
        let in_gap = parse_windows(&format!("daily {h:02}:00-{h:02}:30 {zone}")).unwrap();
        let day_start = local(&format!("{spring} 00:00"));
        let opens = in_gap.state(day_start).next_change.unwrap();
        let closes = in_gap.state(opens).next_change.unwrap();
        assert_eq!(local_text(zone.parse().unwrap(), opens), format!("{spring} {:02}:00 {summer}", h + 1));
        assert_eq!(hours(opens, closes), 0.5, "{zone}: a window in the gap does not vanish");
        // One that starts in the gap and ends just after it keeps its length too.
        let across = parse_windows(&format!("daily {h:02}:30-{:02}:15 {zone}", h + 1)).unwrap();
        let opens = across.state(day_start).next_change.unwrap();
        assert_eq!(hours(opens, across.state(opens).next_change.unwrap()), 0.75);

        // A window in the repeated hour runs once, in the first of the two.
        let repeated = parse_windows(&format!("daily {repeated_hour:02}:00-{repeated_hour:02}:30 {zone}")).unwrap();
        let day_start = local(&format!("{autumn} 00:00"));
        let opens = repeated.state(day_start).next_change.unwrap();
        let closes = repeated.state(opens).next_change.unwrap();
        assert_eq!(hours(opens, closes), 0.5, "{zone}: a window in the repeated hour runs once");
        assert_eq!(hours(day_start, opens), f64::from(repeated_hour));
        assert_eq!(repeated.state(closes).next_change, Some(local(&format!("{} {repeated_hour:02}:00", next(autumn)))));
    }

    fn next(date: &str) -> String {
        NaiveDate::parse_from_str(date, "%Y-%m-%d").unwrap().succ_opt().unwrap().format("%Y-%m-%d").to_string()
    }

    #[test]
    fn daylight_saving_in_berlin_neither_doubles_nor_drops_a_window() {
        both_changes("Europe/Berlin", "2026-03-29", "CEST", "2026-10-25", 2);
    }

    #[test]
    fn daylight_saving_in_new_york_neither_doubles_nor_drops_a_window() {
        both_changes("America/New_York", "2026-03-08", "EDT", "2026-11-01", 1);
    }

    #[test]
    fn bad_ranges_are_refused_with_what_is_wrong() {
        let refused = |text: &str| parse_windows(text).unwrap_err();
        assert_eq!(
            refused("Mon-Fry 22:00-06:00 UTC"),
            r#""Mon-Fry 22:00-06:00 UTC": "Mon-Fry" is not a day; days are Mon..Sun"#
        );
        assert_eq!(
            refused("Mon 22:00-06:00 Europe/Berln"),
            r#""Mon 22:00-06:00 Europe/Berln": "Europe/Berln" is not a time zone; zones are IANA names such as UTC or Europe/Berlin"#
        );
        assert_eq!(
            refused("Mon 22:00-06:00"),
            r#""Mon 22:00-06:00": a time zone is required after the times, e.g. UTC or Europe/Berlin"#
        );
        assert_eq!(
            refused("Mon 25:00-06:00 UTC"),
            r#""Mon 25:00-06:00 UTC": "25:00" is not a time of day; times are HH:MM from 00:00 to 24:00"#
        );
        assert_eq!(
            refused("Mon 24:00-06:00 UTC"),
            r#""Mon 24:00-06:00 UTC": "24:00" is not a time of day; times are HH:MM from 00:00 to 24:00"#
        );
        assert_eq!(refused("Mon 22:00 UTC"), r#""Mon 22:00 UTC": "22:00" is not a range of times; write HH:MM-HH:MM"#);
        assert_eq!(
            refused("Mon 22:00-22:00 UTC"),
            r#""Mon 22:00-22:00 UTC": "22:00-22:00" is empty; a whole day is 00:00-24:00"#
        );
        assert_eq!(
            refused("nightly"),
            r#""nightly": a weekly range is DAYS HH:MM-HH:MM ZONE, e.g. Mon-Fri 22:00-06:00 Europe/Berlin"#
        );
        assert_eq!(refused(" ; "), "no range given; ranges are separated by ;");
        let refused = |text: &str| parse_blackouts(text).unwrap_err();
        assert_eq!(
            refused("2026-12-24T00:00..2026-12-32T00:00 UTC"),
            r#""2026-12-24T00:00..2026-12-32T00:00 UTC": "2026-12-32T00:00" is not a date and time; write YYYY-MM-DDTHH:MM, or YYYY-MM-DD for midnight"#
        );
        assert_eq!(
            refused("2026-12-27..2026-12-24 UTC"),
            r#""2026-12-27..2026-12-24 UTC": "2026-12-27..2026-12-24" ends before it starts"#
        );
        assert!(refused("2026-12-24..2026-12-27").contains("a blackout is START..END ZONE"));
        assert_eq!(
            "stop".parse::<OnClose>().unwrap_err(),
            r#""stop" is not what to do when a window closes; it is drain or cancel"#
        );
        // A whole day, and every day written three ways.
        assert!(parse_windows("Mon 00:00-24:00 UTC").is_ok());
        assert_eq!(parse_windows("daily 01:00-02:00 UTC"), parse_windows("Mon-Sun 01:00-02:00 UTC"));
        assert_eq!(
            parse_windows("mon,tue,wed,thu,fri,sat,sun 01:00-02:00 UTC"),
            parse_windows("Mon-Sun 01:00-02:00 UTC")
        );
    }
}
