//! The integration tests, in one binary so that the library is linked once,
//! not once per test file: each module holds the tests of one concern (named
//! by their module, `cargo test --test it cluster::`), and `support` the
//! harness they share. The tests of all modules run in one process: a test
//! sets what only its children need (an environment variable, a crash
//! point) on their commands, never on the process.

mod support;

mod access;
mod admin_kill;
mod admin_restart;
mod alerts;
mod audit;
mod backup;
mod budget;
mod clock_jumps;
mod cluster;
mod cluster_kill;
mod console;
mod database_faults;
mod descriptors;
mod durability;
mod engine;
mod follower_rules;
mod full_disk;
mod hang_ups;
mod hostile_worker;
mod http_api;
mod import_weed_admin;
mod kill_run;
mod model;
mod network_faults;
mod notify;
mod openapi_fuzz;
mod pg_harness;
mod plugin_schema;
mod postgres_store;
mod priorities;
mod recovery_e2e;
mod retention;
mod scheduler;
mod schedules;
mod seaweedfs_maintenance;
mod seaweedfs_master;
mod seaweedfs_worker;
mod server_workers;
mod soak;
mod store_conformance;
mod tidy;
mod tls;
mod traces;
mod validation;
mod watch_e2e;
mod windows;
mod wire_errors;
