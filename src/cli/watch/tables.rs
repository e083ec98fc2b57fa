//! `jobcenter jobs --watch` and `jobcenter workers --watch`: a table read
//! again every second, full screen on a terminal, printed again and again
//! otherwise (until `--count` refreshes or Ctrl-C).

use std::io::IsTerminal;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use ratatui::crossterm::event::{self as term, KeyCode, KeyEventKind, KeyModifiers};
use ratatui::layout::Constraint;
use ratatui::style::{Color, Modifier, Style};
use ratatui::text::Line;
use ratatui::widgets::{Block, Row, Table, TableState};
use tokio::sync::mpsc;

use super::super::client::Connection;
use super::view::duration;
use crate::clock::{Clock, SystemClock, Timestamp};
use crate::proto::api;

const REFRESH: Duration = Duration::from_secs(1);

/// What a live table shows.
#[derive(Clone, Debug)]
pub(crate) enum Source {
    Jobs { state: Option<String>, limit: u32 },
    Workers,
}

/// A table of text.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct TextTable {
    pub header: Vec<&'static str>,
    pub rows: Vec<Vec<String>>,
}

impl TextTable {
    fn widths(&self) -> Vec<usize> {
        let mut widths: Vec<usize> = self.header.iter().map(|h| h.chars().count()).collect();
        for row in &self.rows {
            for (w, cell) in widths.iter_mut().zip(row) {
                *w = (*w).max(cell.chars().count());
            }
        }
        widths
    }

    /// Aligned columns, two spaces apart; the last column is not padded.
    pub(crate) fn to_text(&self) -> String {
        let widths = self.widths();
        let line = |cells: Vec<&str>| {
            let n = cells.len();
            let mut out = String::new();
            for (i, (cell, w)) in cells.into_iter().zip(&widths).enumerate() {
                if i + 1 == n {
                    out.push_str(cell);
                } else {
                    out.push_str(&format!("{cell:<w$}  "));
                }
            }
            out.trim_end().to_string()
        };
        let mut text = line(self.header.clone());
        for row in &self.rows {
            text.push('\n');
            text.push_str(&line(row.iter().map(String::as_str).collect()));
        }
        text
    }
}

fn time(millis: i64) -> String {
    if millis == 0 {
        "-".into()
    } else {
        Timestamp(millis).to_rfc3339()
    }
}

pub(crate) fn jobs_table(jobs: &[api::JobSummary], now_ms: i64) -> TextTable {
    let rows = jobs
        .iter()
        .map(|j| {
            let end = if j.finished_at_ms > 0 { j.finished_at_ms } else { now_ms };
            vec![
                j.id.clone(),
                j.state.clone(),
                j.tasks.to_string(),
                time(j.created_at_ms),
                duration(end - j.created_at_ms),
                j.name.clone(),
            ]
        })
        .collect();
    TextTable { header: vec!["ID", "STATE", "TASKS", "CREATED", "DURATION", "NAME"], rows }
}

pub(crate) fn workers_table(workers: &[api::Worker]) -> TextTable {
    let rows = workers
        .iter()
        .map(|w| {
            let types: Vec<String> = w
                .capabilities
                .iter()
                .map(|c| {
                    let roles = match (c.can_detect, c.can_execute) {
                        (true, true) => "detect+execute",
                        (true, false) => "detect",
                        _ => "execute",
                    };
                    format!("{}({roles})", c.job_type)
                })
                .collect();
            vec![
                w.worker_id.clone(),
                w.handler.clone(),
                format!("{}/{}", w.execution_slots_used, w.execution_slots_total),
                w.held_attempts.to_string(),
                time(w.last_heartbeat_ms),
                types.join(" "),
            ]
        })
        .collect();
    TextTable { header: vec!["WORKER", "HANDLER", "SLOTS", "HELD", "LAST HEARTBEAT", "JOB TYPES"], rows }
}

async fn fetch(connection: &Connection, source: &Source, now_ms: i64) -> anyhow::Result<TextTable> {
    let mut client = connection.connect().await?;
    let status = |s: tonic::Status| anyhow::anyhow!("{}", s.message());
    Ok(match source {
        Source::Jobs { state, limit } => {
            let request = api::ListJobsRequest {
                state: state.clone().unwrap_or_default(),
                limit: *limit,
                ..api::ListJobsRequest::default()
            };
            jobs_table(&client.list_jobs(request).await.map_err(status)?.into_inner().jobs, now_ms)
        }
        Source::Workers => workers_table(
            &client.list_workers(api::ListWorkersRequest::default()).await.map_err(status)?.into_inner().workers,
        ),
    })
}

fn title(source: &Source) -> &'static str {
    match source {
        Source::Jobs { .. } => "jobs",
        Source::Workers => "workers",
    }
}

/// Shows the table every second: `count` times, or until Ctrl-C (or `q` on a terminal).
pub(crate) async fn live(connection: &Connection, source: Source, count: Option<u32>) -> anyhow::Result<ExitCode> {
    if std::io::stdout().is_terminal() {
        live_screen(connection, source, count).await
    } else {
        live_plain(connection, source, count).await
    }
}

#[allow(clippy::print_stdout)]
async fn live_plain(connection: &Connection, source: Source, count: Option<u32>) -> anyhow::Result<ExitCode> {
    let clock = SystemClock;
    let mut tick = tokio::time::interval(REFRESH);
    let mut shown = 0u32;
    let ctrl_c = tokio::signal::ctrl_c();
    tokio::pin!(ctrl_c);
    while count.is_none_or(|c| shown < c) {
        tokio::select! {
            _ = tick.tick() => {}
            _ = &mut ctrl_c => break,
        }
        let now = clock.now();
        match fetch(connection, &source, now.as_millis()).await {
            Ok(table) => println!("{} at {}\n{}\n", title(&source), now.to_rfc3339(), table.to_text()),
            Err(e) => eprintln!("jobcenter: {e:#}"),
        }
        shown += 1;
    }
    Ok(ExitCode::SUCCESS)
}

async fn live_screen(connection: &Connection, source: Source, count: Option<u32>) -> anyhow::Result<ExitCode> {
    let mut terminal = ratatui::try_init()?;
    let stop = Arc::new(AtomicBool::new(false));
    let (keys_tx, mut keys) = mpsc::unbounded_channel();
    {
        let stop = stop.clone();
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                if !term::poll(Duration::from_millis(100)).unwrap_or(false) {
                    continue;
                }
                if let Ok(term::Event::Key(key)) = term::read() {
                    if key.kind != KeyEventKind::Release && keys_tx.send(key).is_err() {
                        return;
                    }
                }
            }
        });
    }
    let clock = SystemClock;
    let mut tick = tokio::time::interval(REFRESH);
    let mut table = TextTable::default();
    let mut error: Option<String> = None;
    let mut refreshed = String::new();
    let mut selection = TableState::default();
    let mut shown = 0u32;
    let result = loop {
        let widths = table.widths();
        let draw = terminal.draw(|frame| {
            let header = Row::new(table.header.clone()).style(Style::new().add_modifier(Modifier::BOLD));
            let rows: Vec<Row> = table.rows.iter().map(|r| Row::new(r.clone())).collect();
            let constraints: Vec<Constraint> = widths.iter().map(|&w| Constraint::Length(w as u16)).collect();
            let status = match &error {
                Some(e) => Line::from(format!(" {e} ")).style(Style::new().fg(Color::Red)),
                None => Line::from(format!(" refreshed {refreshed} · q to quit ")),
            };
            let block =
                Block::bordered().title(format!(" {} ({}) ", title(&source), table.rows.len())).title_bottom(status);
            let widget = Table::new(rows, constraints)
                .header(header)
                .block(block)
                .row_highlight_style(Style::new().add_modifier(Modifier::REVERSED));
            frame.render_stateful_widget(widget, frame.area(), &mut selection);
        });
        if let Err(e) = draw {
            break Err(anyhow::anyhow!("cannot draw: {e}"));
        }
        if count.is_some_and(|c| shown >= c) {
            break Ok(());
        }
        tokio::select! {
            _ = tick.tick() => {
                let now = clock.now();
                match fetch(connection, &source, now.as_millis()).await {
                    Ok(t) => {
                        table = t;
                        error = None;
                    }
                    Err(e) => error = Some(format!("{e:#}")),
                }
                refreshed = now.to_rfc3339();
                shown += 1;
            }
            key = keys.recv() => match key {
                None => break Ok(()),
                Some(key) => match key.code {
                    KeyCode::Char('q') | KeyCode::Esc => break Ok(()),
                    KeyCode::Char('c') if key.modifiers.contains(KeyModifiers::CONTROL) => break Ok(()),
                    KeyCode::Down | KeyCode::Char('j') => selection.select_next(),
                    KeyCode::Up | KeyCode::Char('k') => selection.select_previous(),
                    _ => {}
                },
            },
        }
    };
    stop.store(true, Ordering::Relaxed);
    ratatui::restore();
    result.map(|()| ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use expect_test::expect;

    use super::*;

    #[test]
    fn tables_align_their_columns() {
        let jobs = vec![
            api::JobSummary {
                id: "0190a2b4-0000-7000-8000-000000000001".into(),
                name: "nine".into(),
                state: "running".into(),
                tasks: 9,
                created_at_ms: 1_000,
                finished_at_ms: 0,
                origin: "user".into(),
            },
            api::JobSummary {
                id: "0190a2b4-0000-7000-8000-000000000002".into(),
                name: "maintenance".into(),
                state: "failed".into(),
                tasks: 120,
                created_at_ms: 2_000,
                finished_at_ms: 75_000,
                origin: "user".into(),
            },
        ];
        expect![[r#"
            ID                                    STATE    TASKS  CREATED                   DURATION  NAME
            0190a2b4-0000-7000-8000-000000000001  running  9      1970-01-01T00:00:01.000Z  4.0s      nine
            0190a2b4-0000-7000-8000-000000000002  failed   120    1970-01-01T00:00:02.000Z  1m13s     maintenance"#]]
        .assert_eq(&jobs_table(&jobs, 5_000).to_text());
        let workers = vec![api::Worker {
            worker_id: "w1".into(),
            handler: "5d8e".into(),
            execution_slots_used: 1,
            execution_slots_total: 4,
            held_attempts: 1,
            capabilities: vec![api::Capability { job_type: "noop".into(), can_execute: true, ..Default::default() }],
            ..Default::default()
        }];
        expect![[r#"
            WORKER  HANDLER  SLOTS  HELD  LAST HEARTBEAT  JOB TYPES
            w1      5d8e     1/4    1     -               noop(execute)"#]]
        .assert_eq(&workers_table(&workers).to_text());
    }
}
