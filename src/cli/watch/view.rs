//! Drawing `jobcenter watch` with ratatui: the header (job, state, counts,
//! elapsed, progress, time left), the graph by level, the task details and
//! the footer. Reads a `WatchState`; draws only the rows on screen.

use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Color, Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Clear, Paragraph, Wrap};
use ratatui::Frame;

use super::state::{Confirm, Link, Mode, Row, WatchState, INDENT};
use crate::clock::Timestamp;
use crate::model::{JobState, TaskState};

/// Width from which the details stand beside the graph instead of over it.
const SIDE_BY_SIDE: u16 = 110;

pub(super) fn glyph(state: TaskState) -> &'static str {
    match state {
        TaskState::Pending => "·",
        TaskState::Ready => "○",
        TaskState::Assigned => "◔",
        TaskState::Running => "▶",
        TaskState::Succeeded => "✓",
        TaskState::Failed => "✗",
        TaskState::UpstreamFailed => "⊘",
        TaskState::Canceled => "⊖",
    }
}

pub(super) fn state_style(state: TaskState) -> Style {
    match state {
        TaskState::Pending => Style::new().fg(Color::DarkGray),
        TaskState::Ready => Style::new().fg(Color::Blue),
        TaskState::Assigned => Style::new().fg(Color::Cyan),
        TaskState::Running => Style::new().fg(Color::Yellow).add_modifier(Modifier::BOLD),
        TaskState::Succeeded => Style::new().fg(Color::Green),
        TaskState::Failed => Style::new().fg(Color::White).bg(Color::Red).add_modifier(Modifier::BOLD),
        TaskState::UpstreamFailed => Style::new().fg(Color::LightRed).add_modifier(Modifier::BOLD),
        TaskState::Canceled => Style::new().fg(Color::Gray).add_modifier(Modifier::DIM),
    }
}

fn job_style(state: Option<JobState>) -> Style {
    let color = match state {
        Some(JobState::Succeeded) => Color::Green,
        Some(JobState::Failed) => Color::Red,
        Some(JobState::Canceled) => Color::Gray,
        Some(JobState::Running) => Color::Yellow,
        Some(JobState::Pending) | None => Color::Blue,
    };
    Style::new().fg(Color::Black).bg(color).add_modifier(Modifier::BOLD)
}

/// `4.2s`, `3m05s`, `2h03m`.
pub(super) fn duration(ms: i64) -> String {
    let ms = ms.max(0);
    if ms < 60_000 {
        format!("{:.1}s", ms as f64 / 1000.0)
    } else if ms < 3_600_000 {
        format!("{}m{:02}s", ms / 60_000, (ms / 1000) % 60)
    } else {
        format!("{}h{:02}m", ms / 3_600_000, (ms / 60_000) % 60)
    }
}

/// A bar of `width` cells, `fraction` of them full.
pub(super) fn bar(fraction: f64, width: usize) -> String {
    let full = ((fraction.clamp(0.0, 1.0) * width as f64).round() as usize).min(width);
    format!("{}{}", "█".repeat(full), "░".repeat(width - full))
}

/// Cuts `text` to `width` columns, marking the cut with `…`.
fn fit(text: &str, width: usize) -> String {
    let n = text.chars().count();
    if n <= width {
        format!("{text:<width$}")
    } else if width == 0 {
        String::new()
    } else {
        let mut cut: String = text.chars().take(width - 1).collect();
        cut.push('…');
        cut
    }
}

/// Draws the whole screen.
pub(super) fn draw(frame: &mut Frame, state: &mut WatchState) {
    let [header, graph, footer] =
        Layout::vertical([Constraint::Length(3), Constraint::Min(3), Constraint::Length(1)]).areas(frame.area());
    draw_header(frame, header, state);
    let details = state.details_open && state.selected_task().is_some();
    let (graph, details_area) = if details && graph.width >= SIDE_BY_SIDE {
        let [left, right] = Layout::horizontal([Constraint::Percentage(55), Constraint::Percentage(45)]).areas(graph);
        (left, Some(right))
    } else if details {
        (graph, Some(graph))
    } else {
        (graph, None)
    };
    draw_graph(frame, graph, state);
    if let (Some(area), Some(idx)) = (details_area, state.selected_task()) {
        frame.render_widget(Clear, area);
        draw_details(frame, area, state, idx);
    }
    draw_footer(frame, footer, state);
}

fn draw_header(frame: &mut Frame, area: Rect, state: &WatchState) {
    if !state.has_snapshot() {
        let text = match &state.link {
            Link::Lost { error, retry_in_ms } => {
                format!(" waiting for the server: {error} (retrying in {})", duration(*retry_in_ms as i64))
            }
            _ => " connecting…".to_string(),
        };
        frame.render_widget(Paragraph::new(text), area);
        return;
    }
    let job = &state.job;
    let mut first = vec![
        Span::styled(format!(" {} ", job.name), Style::new().add_modifier(Modifier::BOLD)),
        Span::styled(job.id.clone(), Style::new().fg(Color::DarkGray)),
        Span::raw("  "),
        Span::styled(format!(" {} ", state.job_state_name()), job_style(job.state)),
    ];
    if job.cancel_requested && !job.is_ended() {
        first.push(Span::styled(" cancel requested", Style::new().fg(Color::Yellow)));
    }
    first.push(Span::raw(format!("  elapsed {}", duration(state.elapsed_ms()))));
    match state.eta_ms() {
        Some(left) => first.push(Span::raw(format!("  left ~{}", duration(left)))),
        None if !job.is_ended() => first.push(Span::raw("  left ?")),
        None => {}
    }
    let mut counts = vec![Span::raw(" ")];
    for (task_state, n) in state.counts().iter().filter(|(_, n)| *n > 0) {
        counts.push(Span::styled(format!("{} {n} {task_state}", glyph(task_state)), state_style(task_state)));
        counts.push(Span::raw("  "));
    }
    if state.is_empty() {
        counts.push(Span::raw("no tasks"));
    }
    let total = state.len();
    let ended = state.counts().terminal();
    let label = format!(" {:>3}%  {ended}/{total} ended", (state.progress() * 100.0).floor());
    let bar_width = (area.width as usize).saturating_sub(label.chars().count() + 2);
    let failing = state.counts().get(TaskState::Failed) + state.counts().get(TaskState::UpstreamFailed) > 0;
    let bar_style = Style::new().fg(if failing { Color::Red } else { Color::Green });
    let progress =
        Line::from(vec![Span::raw(" "), Span::styled(bar(state.progress(), bar_width), bar_style), Span::raw(label)]);
    frame.render_widget(Paragraph::new(vec![Line::from(first), Line::from(counts), progress]), area);
}

fn draw_graph(frame: &mut Frame, area: Rect, state: &mut WatchState) {
    let mut title_right = Vec::new();
    if state.failed_only() {
        title_right.push("failed only".to_string());
    }
    if !state.filter_text().is_empty() {
        title_right.push(format!("filter {:?}", state.filter_text()));
    }
    let block = Block::bordered().title(" graph ");
    let inner = block.inner(area);
    state.set_viewport(inner.width, inner.height);
    state.prepare();
    if !state.rows().is_empty() {
        let first = state.scroll() + 1;
        let last = (state.scroll() + inner.height as usize).min(state.rows().len());
        title_right.push(format!("rows {first}-{last} of {}", state.rows().len()));
    }
    let block = if title_right.is_empty() {
        block
    } else {
        block.title(Line::from(format!(" {} ", title_right.join(" · "))).right_aligned())
    };
    frame.render_widget(block, area);
    let cursor = state.cursor();
    let selected = state.selected_task();
    let lines: Vec<Line> = state
        .visible_rows()
        .map(|(i, row)| match row {
            Row::Level(level) => level_line(state, level, cursor.is_some_and(|(r, _)| r == i)),
            Row::Tasks { level, start, len } => {
                let tasks = &state.shown(level)[start as usize..(start + len) as usize];
                tasks_line(state, tasks, selected)
            }
        })
        .collect();
    let lines = if lines.is_empty() && state.has_snapshot() {
        vec![Line::from(if state.is_filtered() { " no task matches the filter" } else { " no tasks" })]
    } else {
        lines
    };
    frame.render_widget(Paragraph::new(lines), inner);
}

fn level_line(state: &WatchState, level: u32, selected: bool) -> Line<'static> {
    let counts = state.level_counts(level);
    let total = state.level_len(level);
    let fraction = if total == 0 { 0.0 } else { f64::from(counts.terminal()) / total as f64 };
    let arrow = if state.is_folded(level) { "▸" } else { "▾" };
    let label_style = if selected {
        Style::new().add_modifier(Modifier::REVERSED)
    } else {
        Style::new().add_modifier(Modifier::BOLD)
    };
    let mut spans = vec![
        Span::styled(format!("{arrow} level {level}"), label_style),
        Span::raw(format!("  {total} task{}", if total == 1 { "" } else { "s" })),
    ];
    if state.is_filtered() {
        spans.push(Span::raw(format!(", {} shown", state.shown(level).len())));
    }
    let failing = counts.get(TaskState::Failed) + counts.get(TaskState::UpstreamFailed) > 0;
    let bar_style = Style::new().fg(if failing { Color::Red } else { Color::Green });
    spans.push(Span::raw("  "));
    spans.push(Span::styled(bar(fraction, 10), bar_style));
    spans.push(Span::raw(format!(" {:>3}% ", (fraction * 100.0).floor())));
    for (task_state, n) in counts.iter().filter(|(_, n)| *n > 0) {
        spans.push(Span::raw(" "));
        spans.push(Span::styled(format!("{}{n}", glyph(task_state)), state_style(task_state)));
    }
    Line::from(spans)
}

/// A chip's text: icon, id, percent while running, dependencies; built no
/// longer than `width` columns needs (a task may have thousands of parents).
fn chip_label(state: &WatchState, idx: u32, width: usize) -> String {
    let task = state.task(idx);
    let task_state = state.state_of(idx);
    let mut label = format!("{} {}", glyph(task_state), task.id);
    if task_state.is_held() && task.progress_percent > 0.0 {
        label.push_str(&format!(" {:.0}%", task.progress_percent));
    }
    let parents = state.parents(idx);
    if !parents.is_empty() {
        label.push_str(" ←");
        for &p in parents {
            if label.chars().count() > width {
                break;
            }
            label.push(' ');
            label.push_str(&state.task(p).id);
        }
    }
    label
}

fn tasks_line(state: &WatchState, tasks: &[u32], selected: Option<u32>) -> Line<'static> {
    let width = state.chip_width();
    let mut spans = vec![Span::raw(" ".repeat(INDENT as usize))];
    for &idx in tasks {
        let mut style = state_style(state.state_of(idx));
        if selected == Some(idx) {
            style = style.add_modifier(Modifier::REVERSED);
        } else if let Some(sel) = selected {
            if state.parents(sel).contains(&idx) || state.children(sel).contains(&idx) {
                style = style.add_modifier(Modifier::UNDERLINED);
            }
        }
        spans.push(Span::styled(fit(&chip_label(state, idx, width), width - 1), style));
        spans.push(Span::raw(" "));
    }
    Line::from(spans)
}

fn time_line(state: &WatchState, at_ms: i64) -> String {
    if at_ms == 0 {
        return "-".into();
    }
    let clock = Timestamp(at_ms).to_rfc3339();
    let time = clock.get(11..23).unwrap_or(&clock).to_string();
    format!("{time}  (+{})", duration(at_ms - state.job.created_at_ms))
}

fn ids(state: &WatchState, tasks: &[u32]) -> String {
    if tasks.is_empty() {
        return "-".into();
    }
    let mut out: Vec<&str> = tasks.iter().take(20).map(|&t| state.task(t).id.as_str()).collect();
    let more = tasks.len().saturating_sub(20);
    let more = if more > 0 { format!(" and {more} more") } else { String::new() };
    out.sort_unstable();
    format!("{}{more}", out.join(", "))
}

/// The lines of a task's details.
pub(super) fn details_lines(state: &WatchState, idx: u32) -> Vec<Line<'static>> {
    let task = state.task(idx);
    let task_state = state.state_of(idx);
    let field = |name: &str, value: String| {
        Line::from(vec![Span::styled(format!("{name:<11}"), Style::new().fg(Color::DarkGray)), Span::raw(value)])
    };
    let mut lines = vec![
        Line::from(vec![
            Span::styled(format!("{:<11}", "state"), Style::new().fg(Color::DarkGray)),
            Span::styled(format!("{} {task_state}", glyph(task_state)), state_style(task_state)),
            Span::raw(format!("  attempt {}, failures {}, lost {}", task.attempt, task.failures, task.lost)),
        ]),
        field("job type", task.job_type.clone()),
        field("priority", task.priority.clone()),
        field("level", state.level_of(idx).to_string()),
        field("depends on", ids(state, state.parents(idx))),
        field("needed by", ids(state, state.children(idx))),
        field("handler", if task.handler.is_empty() { "-".into() } else { task.handler.clone() }),
    ];
    if !task.worker_id.is_empty() {
        lines.push(field("worker", task.worker_id.clone()));
    }
    lines.push(field("created", time_line(state, task.created_at_ms)));
    lines.push(field("assigned", time_line(state, task.assigned_at_ms)));
    lines.push(field("started", time_line(state, task.started_at_ms)));
    let mut finished = time_line(state, task.finished_at_ms);
    let began = if task.started_at_ms > 0 { task.started_at_ms } else { task.assigned_at_ms };
    if task.finished_at_ms > 0 && began > 0 {
        finished.push_str(&format!(", took {}", duration(task.finished_at_ms - began)));
    }
    lines.push(field("finished", finished));
    if task_state.is_held() || task.progress_percent > 0.0 {
        let stage = if task.stage.is_empty() { String::new() } else { format!("  stage {}", task.stage) };
        lines.push(field("progress", format!("{:.0}%{stage}", task.progress_percent)));
    }
    if !task.error.is_empty() && task_state != TaskState::Succeeded {
        lines.push(Line::from(vec![
            Span::styled(format!("{:<11}", "error"), Style::new().fg(Color::DarkGray)),
            Span::styled(task.error.clone(), Style::new().fg(Color::Red)),
        ]));
    }
    if !task.labels.is_empty() {
        let mut labels: Vec<String> = task.labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
        labels.sort();
        lines.push(field("labels", labels.join(" ")));
    }
    lines.push(Line::from(Span::styled("parameters", Style::new().fg(Color::DarkGray))));
    let parameters = serde_json::from_str::<serde_json::Value>(&task.parameters)
        .ok()
        .and_then(|v| serde_json::to_string_pretty(&v).ok())
        .unwrap_or_else(|| task.parameters.clone());
    lines.extend(parameters.lines().map(|l| Line::from(format!("  {l}"))));
    lines.push(Line::from(Span::styled(
        format!("output ({} line{})", task.output.len(), if task.output.len() == 1 { "" } else { "s" }),
        Style::new().fg(Color::DarkGray),
    )));
    lines.extend(task.output.iter().map(|l| Line::from(format!("  {l}"))));
    lines
}

fn draw_details(frame: &mut Frame, area: Rect, state: &WatchState, idx: u32) {
    let title = format!(" task {} ", state.task(idx).id);
    let block = Block::bordered().title(title).title(Line::from(" esc: close ").right_aligned());
    let paragraph = Paragraph::new(details_lines(state, idx)).block(block).wrap(Wrap { trim: false });
    frame.render_widget(paragraph, area);
}

const HELP: &str =
    " ↑↓←→/hjkl move  enter details/fold  / filter  f failed  +/- unfold/fold  c cancel  r retry  q quit";
const HELP_SHORT: &str = " hjkl move  enter open  / filter  f failed  c cancel  r retry  q quit";
const HELP_SHORTEST: &str = " enter open  / filter  f failed  q quit";

fn draw_footer(frame: &mut Frame, area: Rect, state: &WatchState) {
    let (link, link_style) = match &state.link {
        Link::Connecting => ("◌ connecting".to_string(), Style::new().fg(Color::Yellow)),
        Link::Live => ("● live".to_string(), Style::new().fg(Color::Green)),
        Link::Ended => ("■ ended".to_string(), Style::new().fg(Color::DarkGray)),
        Link::Lost { retry_in_ms, .. } => {
            (format!("✗ reconnecting in {}", duration(*retry_in_ms as i64)), Style::new().fg(Color::Red))
        }
    };
    let left: Line = match &state.mode {
        Mode::Filter => Line::from(vec![
            Span::styled(format!(" /{}▏", state.filter_text()), Style::new().add_modifier(Modifier::BOLD)),
            Span::styled("  enter: keep  esc: clear", Style::new().fg(Color::DarkGray)),
        ]),
        Mode::Confirm(what) => {
            let question = match what {
                Confirm::Cancel => format!(" cancel job {} ({})? y/n", state.job.name, state.job.id),
                Confirm::Retry => format!(" run the failed part of job {} again? y/n", state.job.name),
            };
            Line::from(Span::styled(question, Style::new().fg(Color::Yellow).add_modifier(Modifier::BOLD)))
        }
        Mode::Normal => match &state.message {
            Some(message) => Line::from(Span::styled(format!(" {message}"), Style::new().fg(Color::Yellow))),
            None => {
                let room = (area.width as usize).saturating_sub(link.chars().count() + 2);
                let help = [HELP, HELP_SHORT, HELP_SHORTEST].into_iter().find(|h| h.chars().count() <= room);
                Line::from(Span::styled(help.unwrap_or(HELP_SHORTEST), Style::new().fg(Color::DarkGray)))
            }
        },
    };
    let link_width = link.chars().count() as u16 + 1;
    let [left_area, right_area] = Layout::horizontal([Constraint::Min(0), Constraint::Length(link_width)]).areas(area);
    frame.render_widget(Paragraph::new(left), left_area);
    frame.render_widget(Paragraph::new(Span::styled(link, link_style)), right_area);
}

#[cfg(test)]
mod tests {
    use expect_test::{expect, Expect};
    use ratatui::backend::TestBackend;
    use ratatui::buffer::Buffer;
    use ratatui::Terminal;

    use super::*;
    use crate::cli::watch::state::tests::{job, nine, task, transition, wide};
    use crate::cli::watch::state::Key;
    use crate::proto::api;

    fn render(state: &mut WatchState, width: u16, height: u16) -> Buffer {
        let mut terminal = Terminal::new(TestBackend::new(width, height)).unwrap();
        terminal.draw(|frame| draw(frame, state)).unwrap();
        terminal.backend().buffer().clone()
    }

    fn text(buffer: &Buffer) -> String {
        let area = buffer.area;
        let mut out = String::new();
        for y in 0..area.height {
            let mut line = String::new();
            for x in 0..area.width {
                line.push_str(buffer[(x, y)].symbol());
            }
            out.push_str(line.trim_end());
            out.push('\n');
        }
        out
    }

    fn check(state: &mut WatchState, width: u16, height: u16, expect: Expect) -> Buffer {
        let buffer = render(state, width, height);
        expect.assert_eq(&text(&buffer));
        buffer
    }

    /// Where `needle` starts on screen.
    fn find(buffer: &Buffer, needle: &str) -> Option<(u16, u16)> {
        let area = buffer.area;
        for y in 0..area.height {
            let mut line = String::new();
            let mut columns = Vec::new();
            for x in 0..area.width {
                let symbol = buffer[(x, y)].symbol();
                for _ in symbol.chars() {
                    columns.push(x);
                }
                line.push_str(symbol);
            }
            if let Some(byte) = line.find(needle) {
                let chars = line[..byte].chars().count();
                return Some((columns[chars], y));
            }
        }
        None
    }

    /// The nine-task job after task 4 failed: 7 and 9 never ran.
    fn nine_failed() -> WatchState {
        let mut state = WatchState::new();
        state.apply_snapshot(nine());
        state.set_now(1_000);
        let steps = [
            ("1", "succeeded", 2_000),
            ("2", "succeeded", 2_100),
            ("3", "succeeded", 2_200),
            ("4", "failed", 3_000),
            ("7", "upstream_failed", 3_000),
            ("9", "upstream_failed", 3_000),
            ("5", "succeeded", 3_100),
            ("6", "succeeded", 3_200),
            ("8", "succeeded", 4_400),
        ];
        for (id, task_state, at) in steps {
            let mut t = transition(id, task_state, u32::from(task_state != "upstream_failed"), at);
            if task_state == "failed" {
                t.error = "task 4 failed as asked".into();
            }
            state.apply_transition(&t);
        }
        state.apply_job_transition(&api::JobTransition { state: "failed".into(), at_ms: 4_500 });
        state.link = Link::Ended;
        state
    }

    #[test]
    fn a_small_running_job() {
        let mut state = WatchState::new();
        state.apply_snapshot(nine());
        state.link = Link::Live;
        state.set_now(5_000);
        state.apply_transition(&transition("1", "succeeded", 1, 2_000));
        let mut running = transition("2", "running", 1, 2_000);
        running.progress_percent = 42.0;
        state.apply_transition(&running);
        state.apply_transition(&transition("3", "assigned", 1, 2_500));
        check(
            &mut state,
            80,
            14,
            expect![[r#"
             nine 0190a2b4-0000-7000-8000-000000000001   running   elapsed 4.0s  left ~32.0s
             · 6 pending  ◔ 1 assigned  ▶ 1 running  ✓ 1 succeeded
             ███████░░░░░░░░░░░░░░░░░░░░░░░░░░░░░░░░░░░░░░░░░░░░░░░░░░░░░░░  11%  1/9 ended
            ┌ graph ──────────────────────────────────────────────────────── rows 1-6 of 6 ┐
            │▾ level 0  3 tasks  ███░░░░░░░  33%  ◔1 ▶1 ✓1                                 │
            │   ✓ 1              ▶ 2 42%          ◔ 3                                      │
            │▾ level 1  3 tasks  ░░░░░░░░░░   0%  ·3                                       │
            │   · 4 ← 1 2        · 5 ← 2          · 6 ← 2                                  │
            │▾ level 2  3 tasks  ░░░░░░░░░░   0%  ·3                                       │
            │   · 7 ← 1 2 4      · 8 ← 5 6        · 9 ← 4 6                                │
            │                                                                              │
            │                                                                              │
            └──────────────────────────────────────────────────────────────────────────────┘
             hjkl move  enter open  / filter  f failed  c cancel  r retry  q quit    ● live
        "#]],
        );
    }

    #[test]
    fn a_large_job_folds_into_one_row_per_level() {
        let mut state = WatchState::new();
        state.apply_snapshot(wide(30, 2_000));
        state.link = Link::Live;
        state.set_now(61_000);
        for i in 0..2_000 {
            let task_state = match i % 10 {
                0 => "running",
                1 => "failed",
                _ => "succeeded",
            };
            state.apply_transition(&transition(&format!("t1-{i}"), task_state, 1, 30_000));
        }
        check(
            &mut state,
            100,
            16,
            expect![[r#"
             nine 0190a2b4-0000-7000-8000-000000000001   running   elapsed 1m00s  left ~14m47s
             · 56000 pending  ▶ 200 running  ✓ 3600 succeeded  ✗ 200 failed
             █████░░░░░░░░░░░░░░░░░░░░░░░░░░░░░░░░░░░░░░░░░░░░░░░░░░░░░░░░░░░░░░░░░░░░░░   6%  3800/60000 ended
            ┌ graph ────────────────────────────────────────────────────────────────────────── rows 1-10 of 30 ┐
            │▸ level 0  2000 tasks  ██████████ 100%  ✓2000                                                     │
            │▸ level 1  2000 tasks  █████████░  90%  ▶200 ✓1600 ✗200                                           │
            │▸ level 2  2000 tasks  ░░░░░░░░░░   0%  ·2000                                                     │
            │▸ level 3  2000 tasks  ░░░░░░░░░░   0%  ·2000                                                     │
            │▸ level 4  2000 tasks  ░░░░░░░░░░   0%  ·2000                                                     │
            │▸ level 5  2000 tasks  ░░░░░░░░░░   0%  ·2000                                                     │
            │▸ level 6  2000 tasks  ░░░░░░░░░░   0%  ·2000                                                     │
            │▸ level 7  2000 tasks  ░░░░░░░░░░   0%  ·2000                                                     │
            │▸ level 8  2000 tasks  ░░░░░░░░░░   0%  ·2000                                                     │
            │▸ level 9  2000 tasks  ░░░░░░░░░░   0%  ·2000                                                     │
            └──────────────────────────────────────────────────────────────────────────────────────────────────┘
             hjkl move  enter open  / filter  f failed  c cancel  r retry  q quit                        ● live
        "#]],
        );
        // Unfolding one level shows its tasks under it; the rest stay folded.
        state.handle_key(Key::Down);
        state.handle_key(Key::Enter);
        check(
            &mut state,
            100,
            16,
            expect![[r#"
             nine 0190a2b4-0000-7000-8000-000000000001   running   elapsed 1m00s  left ~14m47s
             · 56000 pending  ▶ 200 running  ✓ 3600 succeeded  ✗ 200 failed
             █████░░░░░░░░░░░░░░░░░░░░░░░░░░░░░░░░░░░░░░░░░░░░░░░░░░░░░░░░░░░░░░░░░░░░░░   6%  3800/60000 ended
            ┌ graph ───────────────────────────────────────────────────────────────────────── rows 1-10 of 697 ┐
            │▸ level 0  2000 tasks  ██████████ 100%  ✓2000                                                     │
            │▾ level 1  2000 tasks  █████████░  90%  ▶200 ✓1600 ✗200                                           │
            │   ▶ t1-0 ← t0-0              ✗ t1-1 ← t0-1              ✓ t1-2 ← t0-2                            │
            │   ✓ t1-3 ← t0-3              ✓ t1-4 ← t0-4              ✓ t1-5 ← t0-5                            │
            │   ✓ t1-6 ← t0-6              ✓ t1-7 ← t0-7              ✓ t1-8 ← t0-8                            │
            │   ✓ t1-9 ← t0-9              ▶ t1-10 ← t0-10            ✗ t1-11 ← t0-11                          │
            │   ✓ t1-12 ← t0-12            ✓ t1-13 ← t0-13            ✓ t1-14 ← t0-14                          │
            │   ✓ t1-15 ← t0-15            ✓ t1-16 ← t0-16            ✓ t1-17 ← t0-17                          │
            │   ✓ t1-18 ← t0-18            ✓ t1-19 ← t0-19            ▶ t1-20 ← t0-20                          │
            │   ✗ t1-21 ← t0-21            ✓ t1-22 ← t0-22            ✓ t1-23 ← t0-23                          │
            └──────────────────────────────────────────────────────────────────────────────────────────────────┘
             hjkl move  enter open  / filter  f failed  c cancel  r retry  q quit                        ● live
        "#]],
        );
    }

    #[test]
    fn the_failed_task_and_its_descendants_stand_out() {
        let mut state = nine_failed();
        let buffer = check(
            &mut state,
            80,
            14,
            expect![[r#"
             nine 0190a2b4-0000-7000-8000-000000000001   failed   elapsed 3.5s
             ✓ 6 succeeded  ✗ 1 failed  ⊘ 2 upstream_failed
             ██████████████████████████████████████████████████████████████ 100%  9/9 ended
            ┌ graph ──────────────────────────────────────────────────────── rows 1-6 of 6 ┐
            │▾ level 0  3 tasks  ██████████ 100%  ✓3                                       │
            │   ✓ 1              ✓ 2              ✓ 3                                      │
            │▾ level 1  3 tasks  ██████████ 100%  ✓2 ✗1                                    │
            │   ✗ 4 ← 1 2        ✓ 5 ← 2          ✓ 6 ← 2                                  │
            │▾ level 2  3 tasks  ██████████ 100%  ✓1 ⊘2                                    │
            │   ⊘ 7 ← 1 2 4      ✓ 8 ← 5 6        ⊘ 9 ← 4 6                                │
            │                                                                              │
            │                                                                              │
            └──────────────────────────────────────────────────────────────────────────────┘
             hjkl move  enter open  / filter  f failed  c cancel  r retry  q quit   ■ ended
        "#]],
        );
        let cell = |needle: &str| {
            let (x, y) = find(&buffer, needle).unwrap_or_else(|| panic!("{needle:?} is not on screen"));
            buffer[(x, y)].clone()
        };
        let failed = cell("✗ 4");
        assert_eq!((failed.fg, failed.bg), (Color::White, Color::Red));
        for descendant in ["⊘ 7", "⊘ 9"] {
            assert_eq!(cell(descendant).fg, Color::LightRed, "{descendant}");
            assert!(cell(descendant).modifier.contains(Modifier::BOLD));
        }
        assert_eq!(cell("✓ 8").fg, Color::Green);
        assert_eq!(cell(" failed ").bg, Color::Red, "the job's state badge");
        // `f` keeps the failed part only.
        state.handle_key(Key::Char('f'));
        check(
            &mut state,
            80,
            14,
            expect![[r#"
             nine 0190a2b4-0000-7000-8000-000000000001   failed   elapsed 3.5s
             ✓ 6 succeeded  ✗ 1 failed  ⊘ 2 upstream_failed
             ██████████████████████████████████████████████████████████████ 100%  9/9 ended
            ┌ graph ────────────────────────────────────────── failed only · rows 1-4 of 4 ┐
            │▾ level 1  3 tasks, 1 shown  ██████████ 100%  ✓2 ✗1                           │
            │   ✗ 4 ← 1 2                                                                  │
            │▾ level 2  3 tasks, 2 shown  ██████████ 100%  ✓1 ⊘2                           │
            │   ⊘ 7 ← 1 2 4      ⊘ 9 ← 4 6                                                 │
            │                                                                              │
            │                                                                              │
            │                                                                              │
            │                                                                              │
            └──────────────────────────────────────────────────────────────────────────────┘
             hjkl move  enter open  / filter  f failed  c cancel  r retry  q quit   ■ ended
        "#]],
        );
    }

    #[test]
    fn the_details_pane_shows_a_task() {
        let mut state = nine_failed();
        let mut four = state.task(state.index_of("4").unwrap()).clone();
        four.parameters = r#"{"fail":true,"sleep_ms":200}"#.into();
        four.handler = "5d8e1f0c-8a4b-4f6e-9d3c-2b1a0f9e8d7c".into();
        four.assigned_at_ms = 2_150;
        four.started_at_ms = 2_200;
        four.failures = 1;
        four.output = vec!["checking volume 4".into(), "error: the check failed".into()];
        state.apply_task_details(four);
        // Down to level 1, then its first task (4), then enter.
        for key in [Key::Down, Key::Down, Key::Down] {
            state.handle_key(key);
        }
        assert_eq!(state.handle_key(Key::Enter), super::super::state::Command::FetchDetails("4".into()));
        check(
            &mut state,
            120,
            26,
            expect![[r#"
             nine 0190a2b4-0000-7000-8000-000000000001   failed   elapsed 3.5s
             ✓ 6 succeeded  ✗ 1 failed  ⊘ 2 upstream_failed
             ██████████████████████████████████████████████████████████████████████████████████████████████████████ 100%  9/9 ended
            ┌ graph ────────────────────────────────────────── rows 1-6 of 6 ┐┌ task 4 ──────────────────────────────── esc: close ┐
            │▾ level 0  3 tasks  ██████████ 100%  ✓3                         ││state      ✗ failed  attempt 1, failures 1, lost 0  │
            │   ✓ 1              ✓ 2              ✓ 3                        ││job type   noop                                     │
            │▾ level 1  3 tasks  ██████████ 100%  ✓2 ✗1                      ││priority   normal                                   │
            │   ✗ 4 ← 1 2        ✓ 5 ← 2          ✓ 6 ← 2                    ││level      1                                        │
            │▾ level 2  3 tasks  ██████████ 100%  ✓1 ⊘2                      ││depends on 1, 2                                     │
            │   ⊘ 7 ← 1 2 4      ✓ 8 ← 5 6        ⊘ 9 ← 4 6                  ││needed by  7, 9                                     │
            │                                                                ││handler    5d8e1f0c-8a4b-4f6e-9d3c-2b1a0f9e8d7c     │
            │                                                                ││created    00:00:01.000  (+0.0s)                    │
            │                                                                ││assigned   00:00:02.150  (+1.1s)                    │
            │                                                                ││started    00:00:02.200  (+1.2s)                    │
            │                                                                ││finished   00:00:03.000  (+2.0s), took 0.8s         │
            │                                                                ││error      task 4 failed as asked                   │
            │                                                                ││parameters                                          │
            │                                                                ││  {                                                 │
            │                                                                ││    "fail": true,                                   │
            │                                                                ││    "sleep_ms": 200                                 │
            │                                                                ││  }                                                 │
            │                                                                ││output (2 lines)                                    │
            │                                                                ││  checking volume 4                                 │
            │                                                                ││  error: the check failed                           │
            └────────────────────────────────────────────────────────────────┘└────────────────────────────────────────────────────┘
             ↑↓←→/hjkl move  enter details/fold  / filter  f failed  +/- unfold/fold  c cancel  r retry  q quit             ■ ended
        "#]],
        );
        // On a narrow screen the details take the graph's place.
        check(
            &mut state,
            70,
            26,
            expect![[r#"
             nine 0190a2b4-0000-7000-8000-000000000001   failed   elapsed 3.5s
             ✓ 6 succeeded  ✗ 1 failed  ⊘ 2 upstream_failed
             ████████████████████████████████████████████████████ 100%  9/9 ended
            ┌ task 4 ──────────────────────────────────────────────── esc: close ┐
            │state      ✗ failed  attempt 1, failures 1, lost 0                  │
            │job type   noop                                                     │
            │priority   normal                                                   │
            │level      1                                                        │
            │depends on 1, 2                                                     │
            │needed by  7, 9                                                     │
            │handler    5d8e1f0c-8a4b-4f6e-9d3c-2b1a0f9e8d7c                     │
            │created    00:00:01.000  (+0.0s)                                    │
            │assigned   00:00:02.150  (+1.1s)                                    │
            │started    00:00:02.200  (+1.2s)                                    │
            │finished   00:00:03.000  (+2.0s), took 0.8s                         │
            │error      task 4 failed as asked                                   │
            │parameters                                                          │
            │  {                                                                 │
            │    "fail": true,                                                   │
            │    "sleep_ms": 200                                                 │
            │  }                                                                 │
            │output (2 lines)                                                    │
            │  checking volume 4                                                 │
            │  error: the check failed                                           │
            └────────────────────────────────────────────────────────────────────┘
             enter open  / filter  f failed  q quit                       ■ ended
        "#]],
        );
    }

    #[test]
    fn prompts_and_the_filter_show_in_the_footer() {
        let mut state = WatchState::new();
        state.apply_snapshot(nine());
        state.set_now(1_000);
        state.handle_key(Key::Char('c'));
        let buffer = render(&mut state, 80, 10);
        assert!(
            text(&buffer).contains("cancel job nine (0190a2b4-0000-7000-8000-000000000001)? y/n"),
            "{}",
            text(&buffer)
        );
        state.handle_key(Key::Char('n'));
        state.handle_key(Key::Char('/'));
        for c in "5".chars() {
            state.handle_key(Key::Char(c));
        }
        let screen = text(&render(&mut state, 80, 10));
        assert!(screen.contains(" /5▏"), "{screen}");
        assert!(screen.contains("filter \"5\""), "{screen}");
        assert!(screen.contains("· 5 ← 2"), "{screen}");
        assert!(!screen.contains("· 4"), "{screen}");
        state.link = Link::Lost { error: "connection refused".into(), retry_in_ms: 1_600 };
        assert!(text(&render(&mut state, 80, 10)).contains("reconnecting in 1.6s"));
    }

    #[test]
    fn a_task_with_thousands_of_parents_gets_a_cut_label() {
        let mut tasks: Vec<api::Task> = (0..5_000).map(|i| task(&format!("p{i}"), "succeeded", &[])).collect();
        let parents: Vec<String> = (0..5_000).map(|i| format!("p{i}")).collect();
        let parents: Vec<&str> = parents.iter().map(String::as_str).collect();
        tasks.push(task("join", "ready", &parents));
        let mut state = WatchState::new();
        state.apply_snapshot(job("running", tasks));
        let label = chip_label(&state, 5_000, state.chip_width());
        assert!(label.starts_with("○ join ← p0 p1 p2"), "{label}");
        assert!(label.chars().count() <= state.chip_width() + 8, "{label}");
        let screen = text(&render(&mut state, 80, 12));
        assert!(screen.contains("▸ level 1  1 task"), "{screen}");
    }

    #[test]
    fn before_the_first_snapshot_it_says_so() {
        let mut state = WatchState::new();
        assert!(text(&render(&mut state, 60, 6)).contains("connecting"));
        state.link = Link::Lost { error: "connection refused".into(), retry_in_ms: 400 };
        assert!(text(&render(&mut state, 90, 6)).contains("waiting for the server: connection refused"));
    }

    #[test]
    fn drawing_a_hundred_thousand_tasks_draws_only_what_is_on_screen() {
        let mut state = WatchState::new();
        state.apply_snapshot(wide(100, 1_000));
        state.handle_key(Key::Char('+'));
        let started = std::time::Instant::now();
        for _ in 0..50 {
            state.handle_key(Key::PageDown);
            render(&mut state, 160, 50);
        }
        // 50 frames; each touches about 50 rows. Generous for a debug build.
        assert!(started.elapsed() < std::time::Duration::from_secs(10), "took {:?}", started.elapsed());
        assert!(state.scroll() > 1_000);
    }
}
