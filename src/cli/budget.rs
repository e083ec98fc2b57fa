//! `jobcenter budget`: show, set or clear the bandwidth budget of the tasks
//! that move data.

#![allow(clippy::print_stdout)]

use std::process::ExitCode;

use super::client::Connection;
use super::EXIT_USAGE;
use crate::budget::Rate;
use crate::proto::api;

#[derive(clap::Args, Debug)]
pub struct BudgetArgs {
    #[command(subcommand)]
    pub command: Option<BudgetCommand>,
    /// Print the budget as JSON.
    #[arg(long, global = true)]
    pub json: bool,
    #[command(flatten)]
    pub connection: Connection,
}

#[derive(clap::Subcommand, Debug)]
pub enum BudgetCommand {
    /// Show the budget, the minimum share, each running task's share and
    /// what is free (the default).
    Show,
    /// Set the budget, or change part of it (what is not given is kept).
    /// Rates: a number and a unit, such as 200MB/s or 20MiB/s.
    Set {
        /// What every budgeted task together may move; required when no budget is set.
        #[arg(long)]
        cluster: Option<String>,
        /// What they may move through one volume server; `none` removes it.
        #[arg(long)]
        per_server: Option<String>,
        /// The least share a task starts with (1MiB/s unless set): one that
        /// would get less waits.
        #[arg(long)]
        minimum: Option<String>,
    },
    /// Remove the budget: the tasks that move data run at their workers' own rates.
    Clear,
}

pub(super) async fn run(args: BudgetArgs) -> anyhow::Result<ExitCode> {
    let mut client = args.connection.connect().await?;
    let answer = match args.command.unwrap_or(BudgetCommand::Show) {
        BudgetCommand::Show => client.get_budget(api::GetBudgetRequest {}).await,
        BudgetCommand::Set { cluster, per_server, minimum } => {
            let request = api::SetBudgetRequest {
                cluster: cluster.unwrap_or_default(),
                per_server: per_server.unwrap_or_default(),
                minimum: minimum.unwrap_or_default(),
                clear: false,
            };
            client.set_budget(request).await
        }
        BudgetCommand::Clear => client.set_budget(api::SetBudgetRequest { clear: true, ..Default::default() }).await,
    };
    let budget = match answer {
        Ok(budget) => budget.into_inner(),
        Err(status) => {
            eprintln!("jobcenter: {}", status.message());
            return Ok(ExitCode::from(EXIT_USAGE));
        }
    };
    if args.json {
        println!("{}", serde_json::to_string(&budget)?);
    } else {
        print!("{}", lines(&budget));
    }
    Ok(ExitCode::SUCCESS)
}

/// The budget as `jobcenter budget` and `jobcenter capacity` print it.
pub(super) fn lines(budget: &api::Budget) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    let types = budget.job_types.join(", ");
    if !budget.set {
        let _ =
            writeln!(out, "bandwidth budget: none: the tasks that move data ({types}) run at their workers' own rates");
        return out;
    }
    let per_server = match budget.per_server_bytes_per_second {
        0 => String::new(),
        rate => format!(", {} through each volume server", Rate(rate)),
    };
    let _ = writeln!(
        out,
        "bandwidth budget: {} over the cluster{per_server}; each task starts with at least {}",
        Rate(budget.cluster_bytes_per_second),
        Rate(budget.minimum_bytes_per_second)
    );
    let _ = writeln!(out, "shared by: {types}");
    let _ = writeln!(
        out,
        "used: {}, free: {}, by {} task(s)",
        Rate(budget.used_bytes_per_second),
        Rate(budget.free_bytes_per_second),
        budget.shares.len()
    );
    if !budget.shares.is_empty() {
        let _ = writeln!(out, "{:<44}  {:<16}  {:>10}  SERVERS", "ATTEMPT", "JOB TYPE", "SHARE");
        for share in &budget.shares {
            let _ = writeln!(
                out,
                "{:<44}  {:<16}  {:>10}  {}",
                share.attempt,
                share.job_type,
                Rate(share.bytes_per_second).to_string(),
                share.servers.join(", ")
            );
        }
    }
    if budget.per_server_bytes_per_second > 0 && !budget.servers.is_empty() {
        let _ = writeln!(out, "{:<44}  {:>10}  {:>10}", "VOLUME SERVER", "USED", "FREE");
        for server in &budget.servers {
            let free = budget.per_server_bytes_per_second.saturating_sub(server.used_bytes_per_second);
            let _ = writeln!(
                out,
                "{:<44}  {:>10}  {:>10}",
                server.server,
                Rate(server.used_bytes_per_second).to_string(),
                Rate(free).to_string()
            );
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_budget_reads_as_its_rates_its_shares_and_what_is_free() {
        let budget = api::Budget {
            set: true,
            cluster_bytes_per_second: 20_000_000,
            per_server_bytes_per_second: 15_000_000,
            minimum_bytes_per_second: 1 << 20,
            used_bytes_per_second: 10_000_000,
            free_bytes_per_second: 10_000_000,
            shares: vec![api::BudgetShare {
                attempt: "0190a2b4-0000-7000-8000-000000000009.0.1".into(),
                job_type: "volume_balance".into(),
                bytes_per_second: 10_000_000,
                servers: vec!["a:8080".into(), "b:8080".into()],
            }],
            servers: vec![api::ServerBudget { server: "a:8080".into(), used_bytes_per_second: 10_000_000 }],
            job_types: vec!["erasure_coding".into(), "volume_balance".into()],
        };
        expect_test::expect![[r#"
            bandwidth budget: 20MB/s over the cluster, 15MB/s through each volume server; each task starts with at least 1MiB/s
            shared by: erasure_coding, volume_balance
            used: 10MB/s, free: 10MB/s, by 1 task(s)
            ATTEMPT                                       JOB TYPE               SHARE  SERVERS
            0190a2b4-0000-7000-8000-000000000009.0.1      volume_balance        10MB/s  a:8080, b:8080
            VOLUME SERVER                                       USED        FREE
            a:8080                                            10MB/s       5MB/s
        "#]]
        .assert_eq(&lines(&budget));
        let none = api::Budget { job_types: vec!["volume_balance".into()], ..Default::default() };
        expect_test::expect![[r#"
            bandwidth budget: none: the tasks that move data (volume_balance) run at their workers' own rates
        "#]]
        .assert_eq(&lines(&none));
    }
}
