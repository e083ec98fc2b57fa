//! The model behind `jobcenter watch`, with no terminal: a job's tasks laid
//! out by topological level, kept current from the watch stream's snapshots
//! and transitions, plus what the operator does to the view (folding,
//! filtering, selection, scrolling, prompts).
//!
//! Everything a frame needs is kept as an index, so that a frame over a
//! 100,000-task job touches only the rows on screen: tasks per level, state
//! counts per level (updated by each transition), the rows of the view
//! (rebuilt only when folding, the filter or the width changes, or a
//! transition changes what a state filter shows), and the first row of each
//! level (to find a selected task without a scan).

use std::collections::HashMap;

use crate::dag::Dag;
use crate::model::{JobState, StateCounts, TaskState};
use crate::proto::api;

/// Columns before the first chip of a row of tasks.
pub(super) const INDENT: u16 = 3;
/// The narrowest and widest a task chip gets, gap included.
const CHIP_MIN: usize = 10;
const CHIP_MAX: usize = 40;
/// Room kept in every chip for a running task's percent (" 100%").
const PERCENT_ROOM: usize = 5;
/// Rows a page key moves when the view has no height yet.
const DEFAULT_PAGE: usize = 10;

/// Parses a task state as the API spells it.
pub(super) fn task_state(text: &str) -> Option<TaskState> {
    TaskState::ALL.into_iter().find(|s| s.as_str() == text)
}

/// The job as a whole.
#[derive(Clone, Debug, Default, PartialEq)]
pub(super) struct JobInfo {
    pub id: String,
    pub name: String,
    pub state: Option<JobState>,
    pub origin: String,
    pub created_at_ms: i64,
    pub finished_at_ms: i64,
    pub cancel_requested: bool,
}

impl JobInfo {
    pub(super) fn is_ended(&self) -> bool {
        self.state.is_some_and(JobState::is_terminal)
    }
}

/// One line of the graph view.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Row {
    /// A level's header: counts and a progress bar; the whole level when folded.
    Level(u32),
    /// Up to `columns` tasks of a level: `shown(level)[start..start + len]`.
    Tasks { level: u32, start: u32, len: u32 },
}

/// What the cursor is on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Selected {
    Level(u32),
    Task(u32),
}

/// What keys currently mean.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Mode {
    Normal,
    /// Typing the text filter after `/`.
    Filter,
    /// Waiting for y/n.
    Confirm(Confirm),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Confirm {
    Cancel,
    Retry,
}

/// The state of the watch stream, for the footer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Link {
    Connecting,
    Live,
    /// The job has ended; the server closed the stream.
    Ended,
    /// The stream broke; the next try is in `retry_in_ms`.
    Lost {
        error: String,
        retry_in_ms: u64,
    },
}

/// A key, as the view's input; the terminal's events map onto these.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Key {
    Up,
    Down,
    Left,
    Right,
    PageUp,
    PageDown,
    Home,
    End,
    Enter,
    Esc,
    Backspace,
    Char(char),
}

/// What a key asks of the program beyond the view.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Command {
    None,
    Quit,
    CancelJob,
    RetryJob,
    /// Fetch the task's latest details (output lines are not in transitions).
    FetchDetails(String),
}

/// A task whose state a snapshot or transition changed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Changed {
    pub idx: u32,
    pub from: TaskState,
    pub to: TaskState,
}

/// The watched job and the view of it.
pub(super) struct WatchState {
    pub job: JobInfo,
    tasks: Vec<api::Task>,
    states: Vec<TaskState>,
    by_id: HashMap<String, u32>,
    dag: Dag,
    level_of: Vec<u32>,
    /// Task indices of each level, ascending.
    levels: Vec<Vec<u32>>,
    level_counts: Vec<StateCounts>,
    counts: StateCounts,
    /// Widest chip label (icon, id, dependencies), in columns.
    label_width: usize,

    filter_text: String,
    failed_only: bool,
    /// Whether each task's id or job type holds the filter text (None: no text).
    text_match: Option<Vec<bool>>,
    /// Tasks of each level that pass the filter (None: no filter, all of `levels`).
    shown: Option<Vec<Vec<u32>>>,
    /// A level's fold as the operator set it; None follows `auto_folded`.
    fold: Vec<Option<bool>>,
    auto_folded: bool,
    rows: Vec<Row>,
    /// The row of each level's header, if the level is on view.
    level_row: Vec<Option<usize>>,
    dirty: bool,
    width: u16,
    height: u16,
    columns: usize,

    pub selected: Option<Selected>,
    scroll: usize,
    pub details_open: bool,
    pub mode: Mode,
    pub message: Option<String>,
    pub link: Link,
    now_ms: i64,
}

impl Default for WatchState {
    fn default() -> WatchState {
        WatchState::new()
    }
}

impl WatchState {
    pub(super) fn new() -> WatchState {
        WatchState {
            job: JobInfo::default(),
            tasks: Vec::new(),
            states: Vec::new(),
            by_id: HashMap::new(),
            dag: Dag::default(),
            level_of: Vec::new(),
            levels: Vec::new(),
            level_counts: Vec::new(),
            counts: StateCounts::default(),
            label_width: 0,
            filter_text: String::new(),
            failed_only: false,
            text_match: None,
            shown: None,
            fold: Vec::new(),
            auto_folded: false,
            rows: Vec::new(),
            level_row: Vec::new(),
            dirty: true,
            width: 80,
            height: 0,
            columns: 1,
            selected: None,
            scroll: 0,
            details_open: false,
            mode: Mode::Normal,
            message: None,
            link: Link::Connecting,
            now_ms: 0,
        }
    }

    // ---- reading ----

    pub(super) fn has_snapshot(&self) -> bool {
        !self.job.id.is_empty()
    }

    pub(super) fn len(&self) -> usize {
        self.tasks.len()
    }

    pub(super) fn is_empty(&self) -> bool {
        self.tasks.is_empty()
    }

    pub(super) fn task(&self, idx: u32) -> &api::Task {
        &self.tasks[idx as usize]
    }

    pub(super) fn state_of(&self, idx: u32) -> TaskState {
        self.states[idx as usize]
    }

    pub(super) fn index_of(&self, task_id: &str) -> Option<u32> {
        self.by_id.get(task_id).copied()
    }

    pub(super) fn parents(&self, idx: u32) -> &[u32] {
        self.dag.parents(idx)
    }

    pub(super) fn children(&self, idx: u32) -> &[u32] {
        self.dag.children(idx)
    }

    pub(super) fn level_of(&self, idx: u32) -> u32 {
        self.level_of[idx as usize]
    }

    #[cfg(test)]
    pub(super) fn n_levels(&self) -> usize {
        self.levels.len()
    }

    pub(super) fn level_len(&self, level: u32) -> usize {
        self.levels[level as usize].len()
    }

    pub(super) fn level_counts(&self, level: u32) -> &StateCounts {
        &self.level_counts[level as usize]
    }

    pub(super) fn counts(&self) -> &StateCounts {
        &self.counts
    }

    /// Tasks of a level that pass the filter, ascending.
    pub(super) fn shown(&self, level: u32) -> &[u32] {
        match &self.shown {
            Some(shown) => &shown[level as usize],
            None => &self.levels[level as usize],
        }
    }

    pub(super) fn filter_text(&self) -> &str {
        &self.filter_text
    }

    pub(super) fn failed_only(&self) -> bool {
        self.failed_only
    }

    pub(super) fn is_filtered(&self) -> bool {
        self.failed_only || !self.filter_text.is_empty()
    }

    pub(super) fn is_folded(&self, level: u32) -> bool {
        self.fold.get(level as usize).copied().flatten().unwrap_or(self.auto_folded)
    }

    /// The width of a chip, gap included.
    pub(super) fn chip_width(&self) -> usize {
        (self.label_width + PERCENT_ROOM + 1).clamp(CHIP_MIN, CHIP_MAX)
    }

    #[cfg(test)]
    pub(super) fn columns(&self) -> usize {
        self.columns
    }

    pub(super) fn rows(&self) -> &[Row] {
        &self.rows
    }

    pub(super) fn scroll(&self) -> usize {
        self.scroll
    }

    /// The rows on screen, with their index.
    pub(super) fn visible_rows(&self) -> impl Iterator<Item = (usize, Row)> + '_ {
        let end = (self.scroll + self.height as usize).min(self.rows.len());
        (self.scroll..end).map(|i| (i, self.rows[i]))
    }

    pub(super) fn set_now(&mut self, now_ms: i64) {
        self.now_ms = now_ms;
    }

    /// From the job's creation to its end, or to now.
    pub(super) fn elapsed_ms(&self) -> i64 {
        if self.job.created_at_ms == 0 {
            return 0;
        }
        let end =
            if self.job.is_ended() && self.job.finished_at_ms > 0 { self.job.finished_at_ms } else { self.now_ms };
        (end - self.job.created_at_ms).max(0)
    }

    /// Ended tasks over all tasks, 0.0 to 1.0.
    pub(super) fn progress(&self) -> f64 {
        if self.tasks.is_empty() {
            return if self.job.is_ended() { 1.0 } else { 0.0 };
        }
        f64::from(self.counts.terminal()) / self.tasks.len() as f64
    }

    /// Time left at the rate tasks have ended so far; None before the first
    /// ends, and once the job has ended.
    pub(super) fn eta_ms(&self) -> Option<i64> {
        let done = i64::from(self.counts.terminal());
        let total = self.tasks.len() as i64;
        if self.job.is_ended() || done == 0 || done >= total {
            return None;
        }
        let elapsed = self.elapsed_ms();
        Some(elapsed * (total - done) / done)
    }

    /// The task under the cursor, if it is a task.
    pub(super) fn selected_task(&self) -> Option<u32> {
        match self.selected {
            Some(Selected::Task(idx)) => Some(idx),
            _ => None,
        }
    }

    /// The failed part: what `f` shows and what a retry runs again.
    pub(super) fn is_failed_part(state: TaskState) -> bool {
        matches!(state, TaskState::Failed | TaskState::UpstreamFailed)
    }

    // ---- applying the stream ----

    /// Replaces everything with a snapshot. For the same job's graph the
    /// layout, folds, filter and selection are kept; returns the tasks whose
    /// state differs from before (empty for a first snapshot).
    pub(super) fn apply_snapshot(&mut self, job: api::Job) -> Vec<Changed> {
        let same_graph = self.job.id == job.id
            && self.tasks.len() == job.tasks.len()
            && self.tasks.iter().zip(&job.tasks).all(|(a, b)| a.id == b.id);
        self.job = JobInfo {
            id: job.id,
            name: job.name,
            state: job.state.parse().ok(),
            origin: job.origin,
            created_at_ms: job.created_at_ms,
            finished_at_ms: job.finished_at_ms,
            cancel_requested: job.cancel_requested,
        };
        let mut changed = Vec::new();
        if same_graph {
            for (idx, task) in job.tasks.into_iter().enumerate() {
                let to = task_state(&task.state).unwrap_or(TaskState::Pending);
                let from = self.states[idx];
                self.tasks[idx] = task;
                if from != to {
                    self.set_state(idx as u32, to);
                    changed.push(Changed { idx: idx as u32, from, to });
                }
            }
        } else {
            self.build(job.tasks);
        }
        self.dirty = true;
        changed
    }

    fn build(&mut self, tasks: Vec<api::Task>) {
        self.by_id = tasks.iter().enumerate().map(|(i, t)| (t.id.clone(), i as u32)).collect();
        let parent_lists: Vec<Vec<u32>> =
            tasks.iter().map(|t| t.depends_on.iter().filter_map(|d| self.by_id.get(d).copied()).collect()).collect();
        self.dag = Dag::from_parents(&parent_lists);
        self.level_of = match self.dag.check_acyclic() {
            Ok(order) => self.dag.levels(&order),
            // The server validated the job; should a cycle come anyway, show one flat level.
            Err(_) => vec![0; tasks.len()],
        };
        let n_levels = self.level_of.iter().max().map_or(0, |&l| l as usize + 1);
        self.levels = vec![Vec::new(); n_levels];
        for (idx, &level) in self.level_of.iter().enumerate() {
            self.levels[level as usize].push(idx as u32);
        }
        self.states = tasks.iter().map(|t| task_state(&t.state).unwrap_or(TaskState::Pending)).collect();
        self.counts = StateCounts::default();
        self.level_counts = vec![StateCounts::default(); n_levels];
        for (idx, &state) in self.states.iter().enumerate() {
            self.counts.add(state);
            self.level_counts[self.level_of[idx] as usize].add(state);
        }
        self.label_width = tasks
            .iter()
            .map(|t| {
                let deps: usize = t.depends_on.iter().map(|d| d.chars().count() + 1).sum();
                let arrow = if deps > 0 { 2 } else { 0 };
                2 + t.id.chars().count() + arrow + deps
            })
            .max()
            .unwrap_or(0);
        self.tasks = tasks;
        self.fold = vec![None; n_levels];
        self.text_match = None;
        self.refresh_text_match();
        self.selected = None;
        self.scroll = 0;
    }

    fn set_state(&mut self, idx: u32, to: TaskState) {
        let from = self.states[idx as usize];
        if from == to {
            return;
        }
        self.states[idx as usize] = to;
        self.counts.shift(from, to);
        self.level_counts[self.level_of[idx as usize] as usize].shift(from, to);
        if self.failed_only {
            self.dirty = true;
        }
    }

    /// Applies one task transition; returns the change if its state changed.
    pub(super) fn apply_transition(&mut self, t: &api::TaskTransition) -> Option<Changed> {
        let idx = self.index_of(&t.task_id)?;
        let to = task_state(&t.state)?;
        let from = self.states[idx as usize];
        let task = &mut self.tasks[idx as usize];
        let new_attempt = t.attempt != task.attempt;
        task.state = t.state.clone();
        task.attempt = t.attempt;
        task.error = t.error.clone();
        task.handler = t.handler.clone();
        task.updated_at_ms = t.at_ms;
        task.progress_percent = t.progress_percent;
        task.stage = t.stage.clone();
        match to {
            TaskState::Pending | TaskState::Ready => {
                task.finished_at_ms = 0;
                task.progress_percent = 0.0;
            }
            TaskState::Assigned => {
                task.assigned_at_ms = t.at_ms;
                task.started_at_ms = 0;
                task.finished_at_ms = 0;
            }
            TaskState::Running => {
                if task.started_at_ms == 0 || new_attempt {
                    task.started_at_ms = t.at_ms;
                }
            }
            _ => task.finished_at_ms = t.at_ms,
        }
        self.set_state(idx, to);
        (from != to).then_some(Changed { idx, from, to })
    }

    pub(super) fn apply_job_transition(&mut self, t: &api::JobTransition) {
        let Ok(state) = t.state.parse::<JobState>() else { return };
        self.job.state = Some(state);
        if state.is_terminal() {
            self.job.finished_at_ms = t.at_ms;
        } else {
            self.job.finished_at_ms = 0;
        }
    }

    /// Applies an event of the watch stream; returns the task changes it made.
    pub(super) fn apply_event(&mut self, event: api::JobEvent) -> Vec<Changed> {
        use api::job_event::Event;
        match event.event {
            Some(Event::Snapshot(job)) => self.apply_snapshot(job),
            Some(Event::Task(t)) => self.apply_transition(&t).into_iter().collect(),
            Some(Event::Job(j)) => {
                self.apply_job_transition(&j);
                Vec::new()
            }
            None => Vec::new(),
        }
    }

    /// A fresher copy of one task (from a full read of the job): its output
    /// lines and times, which transitions do not carry.
    pub(super) fn apply_task_details(&mut self, task: api::Task) {
        let Some(idx) = self.index_of(&task.id) else { return };
        if let Some(to) = task_state(&task.state) {
            self.set_state(idx, to);
        }
        self.tasks[idx as usize] = task;
    }

    // ---- the view ----

    /// Sets the graph area's size; the layout follows on the next `prepare`.
    pub(super) fn set_viewport(&mut self, width: u16, height: u16) {
        if (width, height) != (self.width, self.height) {
            self.width = width;
            self.height = height;
            self.dirty = true;
        }
    }

    fn refresh_text_match(&mut self) {
        if self.filter_text.is_empty() {
            self.text_match = None;
            return;
        }
        let needle = self.filter_text.to_lowercase();
        let matches = self
            .tasks
            .iter()
            .map(|t| t.id.to_lowercase().contains(&needle) || t.job_type.to_lowercase().contains(&needle))
            .collect();
        self.text_match = Some(matches);
    }

    fn passes(&self, idx: u32) -> bool {
        let text = self.text_match.as_ref().is_none_or(|m| m[idx as usize]);
        text && (!self.failed_only || WatchState::is_failed_part(self.states[idx as usize]))
    }

    /// Rebuilds the rows if anything they depend on changed, and keeps the
    /// selection on a row and on screen. Cheap when nothing changed.
    pub(super) fn prepare(&mut self) {
        if !self.dirty {
            return;
        }
        self.dirty = false;
        let chip = self.chip_width();
        self.columns = ((self.width.saturating_sub(INDENT)) as usize / chip).max(1);
        self.shown = if self.is_filtered() {
            Some(self.levels.iter().map(|level| level.iter().copied().filter(|&t| self.passes(t)).collect()).collect())
        } else {
            None
        };
        let columns = self.columns;
        let unfolded_rows: usize = (0..self.levels.len() as u32)
            .map(|l| self.shown(l).len())
            .filter(|&n| n > 0)
            .map(|n| 1 + n.div_ceil(columns))
            .sum();
        self.auto_folded = self.height > 0 && unfolded_rows > self.height as usize;
        self.rows.clear();
        self.level_row = vec![None; self.levels.len()];
        for level in 0..self.levels.len() as u32 {
            let n = self.shown(level).len();
            if n == 0 && (self.is_filtered() || self.levels[level as usize].is_empty()) {
                continue;
            }
            self.level_row[level as usize] = Some(self.rows.len());
            self.rows.push(Row::Level(level));
            if !self.is_folded(level) {
                let mut start = 0;
                while start < n {
                    let len = columns.min(n - start);
                    self.rows.push(Row::Tasks { level, start: start as u32, len: len as u32 });
                    start += len;
                }
            }
        }
        self.settle_selection();
    }

    /// Where the selection is: (row, column), if it is on view.
    pub(super) fn cursor(&self) -> Option<(usize, usize)> {
        match self.selected? {
            Selected::Level(level) => self.level_row.get(level as usize).copied().flatten().map(|row| (row, 0)),
            Selected::Task(idx) => {
                let level = self.level_of[idx as usize];
                let header = self.level_row.get(level as usize).copied().flatten()?;
                if self.is_folded(level) {
                    return None;
                }
                let pos = self.shown(level).binary_search(&idx).ok()?;
                Some((header + 1 + pos / self.columns, pos % self.columns))
            }
        }
    }

    /// The selection at a row and column (clamped to the row's length).
    fn select_at(&mut self, row: usize, column: usize) {
        let Some(&r) = self.rows.get(row) else { return };
        self.selected = Some(match r {
            Row::Level(level) => Selected::Level(level),
            Row::Tasks { level, start, len } => {
                let column = column.min(len as usize - 1);
                Selected::Task(self.shown(level)[start as usize + column])
            }
        });
        self.keep_on_screen(row);
    }

    fn keep_on_screen(&mut self, row: usize) {
        let height = (self.height as usize).max(1);
        if row < self.scroll {
            self.scroll = row;
        } else if row >= self.scroll + height {
            self.scroll = row + 1 - height;
        }
        let max_scroll = self.rows.len().saturating_sub(height);
        self.scroll = self.scroll.min(max_scroll);
    }

    /// After the rows change: a hidden task selection falls back to its
    /// level, a hidden level to the nearest row.
    fn settle_selection(&mut self) {
        if self.rows.is_empty() {
            self.scroll = 0;
            return;
        }
        if let Some((row, _)) = self.cursor() {
            self.keep_on_screen(row);
            return;
        }
        let level = match self.selected {
            Some(Selected::Task(idx)) => self.level_of.get(idx as usize).copied(),
            Some(Selected::Level(level)) => Some(level),
            None => None,
        };
        let row = match level {
            Some(level) => match self.level_row.get(level as usize).copied().flatten() {
                Some(row) => row,
                None => self
                    .rows
                    .iter()
                    .position(|r| matches!(r, Row::Level(l) if *l > level))
                    .unwrap_or(self.rows.len() - 1),
            },
            None => 0,
        };
        self.select_at(row, 0);
    }

    fn move_rows(&mut self, delta: isize) {
        self.prepare();
        if self.rows.is_empty() {
            return;
        }
        let (row, column) = self.cursor().unwrap_or((0, 0));
        let target = row.saturating_add_signed(delta).min(self.rows.len() - 1);
        self.select_at(target, column);
    }

    fn move_column(&mut self, forward: bool) {
        self.prepare();
        if self.rows.is_empty() {
            return;
        }
        let (row, column) = self.cursor().unwrap_or((0, 0));
        let len = match self.rows[row] {
            Row::Level(_) => 1,
            Row::Tasks { len, .. } => len as usize,
        };
        if forward {
            if column + 1 < len {
                self.select_at(row, column + 1);
            } else if row + 1 < self.rows.len() {
                self.select_at(row + 1, 0);
            }
        } else if column > 0 {
            self.select_at(row, column - 1);
        } else if row > 0 {
            self.select_at(row - 1, usize::MAX);
        }
    }

    fn page(&self) -> isize {
        let page = if self.height > 1 { self.height as usize - 1 } else { DEFAULT_PAGE };
        page as isize
    }

    /// Folds or unfolds a level.
    pub(super) fn toggle_fold(&mut self, level: u32) {
        if let Some(fold) = self.fold.get_mut(level as usize) {
            let folded = fold.unwrap_or(self.auto_folded);
            *fold = Some(!folded);
            self.selected = Some(Selected::Level(level));
            self.dirty = true;
            self.prepare();
        }
    }

    pub(super) fn fold_all(&mut self, folded: bool) {
        self.fold.iter_mut().for_each(|f| *f = Some(folded));
        if let Some(Selected::Task(idx)) = self.selected {
            if folded {
                self.selected = Some(Selected::Level(self.level_of[idx as usize]));
            }
        }
        self.dirty = true;
        self.prepare();
    }

    pub(super) fn set_filter_text(&mut self, text: &str) {
        self.filter_text = text.to_string();
        self.refresh_text_match();
        self.dirty = true;
        self.prepare();
    }

    pub(super) fn set_failed_only(&mut self, failed_only: bool) {
        self.failed_only = failed_only;
        self.dirty = true;
        self.prepare();
    }

    /// Selects a task by id, unfolding its level.
    #[cfg(test)]
    pub(super) fn select_task(&mut self, task_id: &str) -> bool {
        let Some(idx) = self.index_of(task_id) else { return false };
        let level = self.level_of[idx as usize];
        if self.is_folded(level) {
            self.fold[level as usize] = Some(false);
        }
        self.selected = Some(Selected::Task(idx));
        self.dirty = true;
        self.prepare();
        self.cursor().is_some()
    }

    /// Handles a key; returns what the program should do beyond the view.
    pub(super) fn handle_key(&mut self, key: Key) -> Command {
        self.prepare();
        match self.mode.clone() {
            Mode::Filter => self.filter_key(key),
            Mode::Confirm(what) => {
                self.mode = Mode::Normal;
                match key {
                    Key::Char('y' | 'Y') => {
                        self.message = None;
                        match what {
                            Confirm::Cancel => Command::CancelJob,
                            Confirm::Retry => Command::RetryJob,
                        }
                    }
                    _ => {
                        self.message = Some("nothing done".into());
                        Command::None
                    }
                }
            }
            Mode::Normal => self.normal_key(key),
        }
    }

    fn filter_key(&mut self, key: Key) -> Command {
        match key {
            Key::Enter => self.mode = Mode::Normal,
            Key::Esc => {
                self.mode = Mode::Normal;
                self.set_filter_text("");
            }
            Key::Backspace => {
                let mut text = self.filter_text.clone();
                text.pop();
                self.set_filter_text(&text);
            }
            Key::Char(c) => {
                let mut text = self.filter_text.clone();
                text.push(c);
                self.set_filter_text(&text);
            }
            _ => {}
        }
        Command::None
    }

    fn normal_key(&mut self, key: Key) -> Command {
        self.message = None;
        match key {
            Key::Char('q') => return Command::Quit,
            Key::Esc if self.details_open => self.details_open = false,
            Key::Esc if self.is_filtered() => {
                self.filter_text.clear();
                self.text_match = None;
                self.set_failed_only(false);
            }
            Key::Up | Key::Char('k') => self.move_rows(-1),
            Key::Down | Key::Char('j') => self.move_rows(1),
            Key::Left | Key::Char('h') => self.move_column(false),
            Key::Right | Key::Char('l') => self.move_column(true),
            Key::PageUp => self.move_rows(-self.page()),
            Key::PageDown => self.move_rows(self.page()),
            Key::Home | Key::Char('g') => self.move_rows(isize::MIN / 2),
            Key::End | Key::Char('G') => self.move_rows(isize::MAX / 2),
            Key::Enter => match self.selected {
                Some(Selected::Level(level)) => self.toggle_fold(level),
                Some(Selected::Task(idx)) => {
                    self.details_open = !self.details_open;
                    if self.details_open {
                        return Command::FetchDetails(self.tasks[idx as usize].id.clone());
                    }
                }
                None => self.move_rows(0),
            },
            Key::Char(' ') => {
                let level = match self.selected {
                    Some(Selected::Level(level)) => Some(level),
                    Some(Selected::Task(idx)) => Some(self.level_of[idx as usize]),
                    None => None,
                };
                if let Some(level) = level {
                    self.toggle_fold(level);
                }
            }
            Key::Char('+') => self.fold_all(false),
            Key::Char('-') => self.fold_all(true),
            Key::Char('/') => self.mode = Mode::Filter,
            Key::Char('f') => self.set_failed_only(!self.failed_only),
            Key::Char('c') => {
                if self.job.is_ended() {
                    self.message = Some(format!("the job has already ended ({})", self.job_state_name()));
                } else {
                    self.mode = Mode::Confirm(Confirm::Cancel);
                }
            }
            Key::Char('r') => {
                if !self.job.is_ended() {
                    self.message = Some("only an ended job can be retried".into());
                } else if self.job.state == Some(JobState::Succeeded) {
                    self.message = Some("the job succeeded: nothing to retry".into());
                } else {
                    self.mode = Mode::Confirm(Confirm::Retry);
                }
            }
            _ => {}
        }
        Command::None
    }

    pub(super) fn job_state_name(&self) -> &'static str {
        self.job.state.map_or("unknown", JobState::as_str)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A task of a test job.
    pub(crate) fn task(id: &str, state: &str, deps: &[&str]) -> api::Task {
        api::Task {
            id: id.into(),
            job_type: "noop".into(),
            state: state.into(),
            depends_on: deps.iter().map(|d| d.to_string()).collect(),
            parameters: "{}".into(),
            priority: "normal".into(),
            created_at_ms: 1_000,
            updated_at_ms: 1_000,
            ..api::Task::default()
        }
    }

    pub(crate) fn job(state: &str, tasks: Vec<api::Task>) -> api::Job {
        api::Job {
            id: "0190a2b4-0000-7000-8000-000000000001".into(),
            name: "nine".into(),
            state: state.into(),
            origin: "user".into(),
            created_at_ms: 1_000,
            tasks,
            ..api::Job::default()
        }
    }

    /// The specification's nine-task job, every task pending or ready.
    pub(crate) fn nine() -> api::Job {
        let deps: [&[&str]; 9] =
            [&[], &[], &[], &["1", "2"], &["2"], &["2"], &["1", "2", "4"], &["5", "6"], &["4", "6"]];
        let tasks = deps
            .iter()
            .enumerate()
            .map(|(i, d)| task(&(i + 1).to_string(), if d.is_empty() { "ready" } else { "pending" }, d))
            .collect();
        job("running", tasks)
    }

    /// A job of `levels` levels of `width` tasks, each depending on the task above it.
    pub(crate) fn wide(levels: usize, width: usize) -> api::Job {
        let mut tasks = Vec::with_capacity(levels * width);
        for l in 0..levels {
            for w in 0..width {
                let id = format!("t{l}-{w}");
                let parent = (l > 0).then(|| format!("t{}-{w}", l - 1));
                let mut t = task(&id, if l == 0 { "succeeded" } else { "pending" }, &[]);
                t.depends_on = parent.into_iter().collect();
                tasks.push(t);
            }
        }
        job("running", tasks)
    }

    pub(crate) fn transition(id: &str, state: &str, attempt: u32, at_ms: i64) -> api::TaskTransition {
        api::TaskTransition { task_id: id.into(), state: state.into(), attempt, at_ms, ..Default::default() }
    }

    fn prepared(job: api::Job, width: u16, height: u16) -> WatchState {
        let mut state = WatchState::new();
        state.apply_snapshot(job);
        state.set_viewport(width, height);
        state.prepare();
        state
    }

    fn selected_id(state: &WatchState) -> Option<String> {
        state.selected_task().map(|idx| state.task(idx).id.clone())
    }

    #[test]
    fn lays_tasks_out_by_level() {
        let state = prepared(nine(), 80, 20);
        let levels: Vec<Vec<&str>> = (0..state.n_levels() as u32)
            .map(|l| state.shown(l).iter().map(|&i| state.task(i).id.as_str()).collect())
            .collect();
        assert_eq!(levels, vec![vec!["1", "2", "3"], vec!["4", "5", "6"], vec!["7", "8", "9"]]);
        assert_eq!(state.counts().get(TaskState::Ready), 3);
        assert_eq!(state.counts().get(TaskState::Pending), 6);
        let four = state.index_of("4").unwrap();
        let parents: Vec<&str> = state.parents(four).iter().map(|&i| state.task(i).id.as_str()).collect();
        assert_eq!(parents, vec!["1", "2"]);
        // Everything fits: three headers, one row of tasks each.
        assert_eq!(state.rows().len(), 6);
        assert!(!state.is_folded(0));
    }

    #[test]
    fn transitions_update_counts_and_times() {
        let mut state = prepared(nine(), 80, 20);
        assert_eq!(
            state.apply_transition(&transition("1", "assigned", 1, 2_000)).map(|c| c.to),
            Some(TaskState::Assigned)
        );
        let mut running = transition("1", "running", 1, 2_500);
        running.progress_percent = 42.0;
        state.apply_transition(&running);
        // A progress report in the same state is not a change.
        assert_eq!(state.apply_transition(&running), None);
        state.apply_transition(&transition("1", "succeeded", 1, 3_000));
        let one = state.task(state.index_of("1").unwrap());
        assert_eq!((one.assigned_at_ms, one.started_at_ms, one.finished_at_ms), (2_000, 2_500, 3_000));
        assert_eq!(state.counts().get(TaskState::Succeeded), 1);
        assert_eq!(state.level_counts(0).get(TaskState::Ready), 2);
        assert_eq!(state.level_counts(0).get(TaskState::Succeeded), 1);
        assert_eq!(state.apply_transition(&transition("nope", "failed", 1, 1)), None);
    }

    #[test]
    fn progress_and_time_left() {
        let mut state = prepared(nine(), 80, 20);
        state.set_now(5_000);
        assert_eq!(state.elapsed_ms(), 4_000);
        assert_eq!(state.eta_ms(), None);
        for id in ["1", "2", "3"] {
            state.apply_transition(&transition(id, "succeeded", 1, 2_000));
        }
        // Three of nine in 4 s: six more take 8 s.
        assert_eq!(state.eta_ms(), Some(8_000));
        assert!((state.progress() - 1.0 / 3.0).abs() < 1e-9);
        state.apply_job_transition(&api::JobTransition { state: "failed".into(), at_ms: 7_000 });
        assert_eq!(state.elapsed_ms(), 6_000);
        assert_eq!(state.eta_ms(), None);
    }

    #[test]
    fn a_new_snapshot_of_the_same_job_keeps_the_view_and_reports_changes() {
        let mut state = prepared(nine(), 80, 20);
        state.select_task("5");
        state.set_failed_only(false);
        let mut later = nine();
        later.tasks[0].state = "succeeded".into();
        later.tasks[3].state = "failed".into();
        let changed = state.apply_snapshot(later);
        assert_eq!(
            changed,
            vec![
                Changed { idx: 0, from: TaskState::Ready, to: TaskState::Succeeded },
                Changed { idx: 3, from: TaskState::Pending, to: TaskState::Failed },
            ]
        );
        assert_eq!(selected_id(&state).as_deref(), Some("5"));
        assert_eq!(state.counts().get(TaskState::Failed), 1);
        // Another job replaces the graph.
        let mut other = wide(2, 2);
        other.id = "another".into();
        assert!(state.apply_snapshot(other).is_empty());
        assert_eq!(state.len(), 4);
        assert_eq!(state.selected, None);
    }

    #[test]
    fn moves_across_rows_and_columns() {
        let mut state = prepared(nine(), 80, 20);
        assert_eq!(state.selected, Some(Selected::Level(0)));
        state.handle_key(Key::Down);
        assert_eq!(selected_id(&state).as_deref(), Some("1"));
        state.handle_key(Key::Char('l'));
        state.handle_key(Key::Right);
        assert_eq!(selected_id(&state).as_deref(), Some("3"));
        // Past the end of a row: the next row, a level header.
        state.handle_key(Key::Right);
        assert_eq!(state.selected, Some(Selected::Level(1)));
        state.handle_key(Key::Char('j'));
        state.handle_key(Key::Char('j'));
        state.handle_key(Key::Char('j'));
        assert_eq!(selected_id(&state).as_deref(), Some("7"));
        state.handle_key(Key::Char('k'));
        assert_eq!(state.selected, Some(Selected::Level(2)));
        state.handle_key(Key::Left);
        assert_eq!(selected_id(&state).as_deref(), Some("6"));
        state.handle_key(Key::Home);
        assert_eq!(state.selected, Some(Selected::Level(0)));
        state.handle_key(Key::End);
        assert_eq!(selected_id(&state).as_deref(), Some("7"));
    }

    #[test]
    fn a_large_job_folds_and_unfolds() {
        // 5 levels of 40 tasks: with 3-column rows that is 5 * (1 + 14) rows, more than 20.
        let mut state = prepared(wide(5, 40), 80, 20);
        assert_eq!(state.columns(), 3);
        assert!(state.is_folded(0));
        assert_eq!(state.rows(), &[Row::Level(0), Row::Level(1), Row::Level(2), Row::Level(3), Row::Level(4)]);
        state.handle_key(Key::Down);
        assert_eq!(state.selected, Some(Selected::Level(1)));
        state.handle_key(Key::Enter);
        assert!(!state.is_folded(1));
        assert!(state.is_folded(0));
        let columns = state.columns();
        assert_eq!(state.rows().len(), 5 + 40usize.div_ceil(columns));
        state.handle_key(Key::Down);
        assert_eq!(selected_id(&state).as_deref(), Some("t1-0"));
        // Folding the level of the selected task moves the cursor to the level.
        state.handle_key(Key::Char(' '));
        assert_eq!(state.selected, Some(Selected::Level(1)));
        assert_eq!(state.rows().len(), 5);
        state.handle_key(Key::Char('+'));
        assert_eq!(state.rows().len(), 5 * (1 + 40usize.div_ceil(columns)));
        state.handle_key(Key::Char('-'));
        assert_eq!(state.rows().len(), 5);
    }

    #[test]
    fn scrolling_keeps_the_cursor_on_screen() {
        let mut state = prepared(wide(3, 200), 80, 10);
        state.fold_all(false);
        for _ in 0..25 {
            state.handle_key(Key::Down);
        }
        let (row, _) = state.cursor().unwrap();
        assert_eq!(row, 25);
        assert!(state.scroll() <= row && row < state.scroll() + 10, "row {row}, scroll {}", state.scroll());
        assert_eq!(state.visible_rows().count(), 10);
        state.handle_key(Key::PageUp);
        assert_eq!(state.cursor().unwrap().0, 16);
        state.handle_key(Key::Home);
        assert_eq!(state.scroll(), 0);
    }

    #[test]
    fn filters_by_text_and_by_failure() {
        let mut state = prepared(nine(), 80, 20);
        state.apply_transition(&transition("4", "failed", 1, 2_000));
        for id in ["7", "9"] {
            state.apply_transition(&transition(id, "upstream_failed", 0, 2_000));
        }
        state.handle_key(Key::Char('f'));
        let shown: Vec<u32> = (0..3).flat_map(|l| state.shown(l).to_vec()).collect();
        let ids: Vec<&str> = shown.iter().map(|&i| state.task(i).id.as_str()).collect();
        assert_eq!(ids, vec!["4", "7", "9"]);
        // Level 0 has no failed task: it is not on view.
        assert_eq!(state.rows().first(), Some(&Row::Level(1)));
        // A task that fails later joins the filtered view.
        state.apply_transition(&transition("8", "failed", 1, 2_500));
        state.prepare();
        assert_eq!(state.shown(2).len(), 3);
        state.handle_key(Key::Char('f'));
        state.handle_key(Key::Char('/'));
        assert_eq!(state.mode, Mode::Filter);
        for c in "3".chars() {
            state.handle_key(Key::Char(c));
        }
        let ids: Vec<u32> = (0..3).flat_map(|l| state.shown(l).to_vec()).collect();
        assert_eq!(ids, vec![state.index_of("3").unwrap()]);
        state.handle_key(Key::Backspace);
        assert!(!state.is_filtered());
        state.handle_key(Key::Char('9'));
        state.handle_key(Key::Enter);
        assert_eq!(state.mode, Mode::Normal);
        assert_eq!(state.filter_text(), "9");
        state.handle_key(Key::Esc);
        assert!(!state.is_filtered());
    }

    #[test]
    fn a_selected_task_filtered_away_falls_back_to_its_level() {
        let mut state = prepared(nine(), 80, 20);
        assert!(state.select_task("5"));
        state.set_filter_text("4");
        assert_eq!(state.selected, Some(Selected::Level(1)));
        state.set_filter_text("");
        assert!(state.select_task("8"));
        state.set_filter_text("1");
        // Level 2 is not on view: the cursor goes to the last row before it.
        assert!(state.cursor().is_some());
    }

    #[test]
    fn enter_opens_details_and_asks_for_them() {
        let mut state = prepared(nine(), 80, 20);
        state.select_task("4");
        assert_eq!(state.handle_key(Key::Enter), Command::FetchDetails("4".into()));
        assert!(state.details_open);
        let mut fresh = task("4", "failed", &["1", "2"]);
        fresh.output = vec!["line one".into()];
        fresh.error = "boom".into();
        state.apply_task_details(fresh);
        assert_eq!(state.task(state.index_of("4").unwrap()).output, vec!["line one".to_string()]);
        assert_eq!(state.counts().get(TaskState::Failed), 1);
        state.handle_key(Key::Esc);
        assert!(!state.details_open);
    }

    #[test]
    fn cancel_and_retry_ask_first() {
        let mut state = prepared(nine(), 80, 20);
        assert_eq!(state.handle_key(Key::Char('c')), Command::None);
        assert_eq!(state.mode, Mode::Confirm(Confirm::Cancel));
        assert_eq!(state.handle_key(Key::Char('n')), Command::None);
        assert_eq!(state.mode, Mode::Normal);
        state.handle_key(Key::Char('c'));
        assert_eq!(state.handle_key(Key::Char('y')), Command::CancelJob);
        // Retry is for an ended job that did not succeed.
        state.handle_key(Key::Char('r'));
        assert_eq!(state.mode, Mode::Normal);
        assert!(state.message.as_deref().unwrap().contains("only an ended job"));
        state.apply_job_transition(&api::JobTransition { state: "failed".into(), at_ms: 9_000 });
        state.handle_key(Key::Char('r'));
        assert_eq!(state.handle_key(Key::Char('y')), Command::RetryJob);
        state.handle_key(Key::Char('c'));
        assert!(state.message.as_deref().unwrap().contains("already ended"));
        assert_eq!(state.handle_key(Key::Char('q')), Command::Quit);
    }

    #[test]
    fn a_retry_brings_a_job_back_to_running() {
        let mut state = prepared(nine(), 80, 20);
        state.apply_transition(&transition("4", "failed", 1, 2_000));
        state.apply_job_transition(&api::JobTransition { state: "failed".into(), at_ms: 3_000 });
        assert!(state.job.is_ended());
        state.apply_job_transition(&api::JobTransition { state: "running".into(), at_ms: 4_000 });
        state.apply_transition(&transition("4", "ready", 1, 4_000));
        assert!(!state.job.is_ended());
        assert_eq!(state.job.finished_at_ms, 0);
        assert_eq!(state.counts().get(TaskState::Failed), 0);
        assert_eq!(state.task(state.index_of("4").unwrap()).finished_at_ms, 0);
    }

    #[test]
    fn stays_fast_on_a_hundred_thousand_tasks() {
        let started = std::time::Instant::now();
        let mut state = prepared(wide(100, 1_000), 160, 40);
        assert!(state.is_folded(0));
        assert_eq!(state.rows().len(), 100);
        state.handle_key(Key::Char('+'));
        state.handle_key(Key::End);
        let last = state.selected_task().unwrap();
        assert_eq!(state.level_of(last), 99);
        for i in 0..1_000 {
            state.apply_transition(&transition(
                &format!("t1-{i}"),
                if i % 100 == 0 { "failed" } else { "succeeded" },
                1,
                5_000,
            ));
        }
        state.handle_key(Key::Char('f'));
        assert_eq!(state.shown(1).len(), 10);
        state.handle_key(Key::Char('f'));
        state.handle_key(Key::Char('/'));
        for c in "t42-99".chars() {
            state.handle_key(Key::Char(c));
        }
        assert_eq!(state.shown(42).len(), 11);
        // Generous: debug builds on a loaded machine; in release this is milliseconds.
        assert!(started.elapsed() < std::time::Duration::from_secs(20), "took {:?}", started.elapsed());
    }
}
