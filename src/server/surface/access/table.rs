//! The one table of who may do what: every HTTP route (by method and path
//! pattern) and every gRPC method the server serves, with the role it needs
//! or none. A route or method without a row needs `admin`; tests check the
//! table against the router, `openapi.json` and the proto files, and a
//! real server against the table.

use axum::http::Method;

pub use super::Role;

/// What a request needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Need {
    /// Nothing: the console's files, health, the sign-in, the worker's
    /// first question and the OpenAPI document.
    Open,
    /// A credential whose role covers one of these.
    Any(&'static [Role]),
}

impl Need {
    /// Whether `role` may do what this needs.
    pub fn admits(self, role: Role) -> bool {
        match self {
            Need::Open => true,
            Need::Any(roles) => roles.iter().any(|needed| role.covers(*needed)),
        }
    }
}

/// The roles a refusal names: `operator`, or `operator or instance`.
pub fn either(roles: &[Role]) -> String {
    roles.iter().map(|r| r.name()).collect::<Vec<_>>().join(" or ")
}

use Need::Open;
const VIEWER: Need = Need::Any(&[Role::Viewer]);
const OPERATOR: Need = Need::Any(&[Role::Operator]);
const WORKER: Need = Need::Any(&[Role::Worker]);
const INSTANCE: Need = Need::Any(&[Role::Instance]);
const ADMIN: Need = Need::Any(&[Role::Admin]);
/// What one instance also asks another on the client API: a cancel of a
/// job the other leads, and the other's part of the recovery check.
const OPERATOR_OR_INSTANCE: Need = Need::Any(&[Role::Operator, Role::Instance]);

/// Every HTTP route: method, path as the router writes it, need.
pub const HTTP: &[(&str, &str, Need)] = &[
    ("GET", "/", Open),
    ("GET", "/console/{file}", Open),
    ("GET", "/healthz", Open),
    ("GET", "/readyz", Open),
    ("GET", "/api/plugin/status", Open),
    ("GET", "/api/openapi.json", Open),
    ("GET", "/api/session", Open),
    ("POST", "/api/session", Open),
    ("DELETE", "/api/session", Open),
    ("GET", "/api/overview", VIEWER),
    ("GET", "/api/jobs", VIEWER),
    ("POST", "/api/jobs", OPERATOR),
    ("GET", "/api/jobs/{id}", VIEWER),
    ("GET", "/api/jobs/{id}/graph", VIEWER),
    ("GET", "/api/jobs/{id}/tasks/{task}", VIEWER),
    ("GET", "/api/jobs/{id}/events", VIEWER),
    ("POST", "/api/jobs/{id}/cancel", OPERATOR),
    ("POST", "/api/jobs/{id}/retry", OPERATOR),
    ("POST", "/api/jobs/{id}/priority", OPERATOR),
    ("GET", "/api/job-types", VIEWER),
    ("GET", "/api/job-types/{job_type}", VIEWER),
    ("GET", "/api/workers", VIEWER),
    ("GET", "/api/instances", VIEWER),
    ("GET", "/api/capacity", VIEWER),
    ("GET", "/api/stats", VIEWER),
    ("GET", "/api/activities", VIEWER),
    ("GET", "/api/runs/{job_type}", VIEWER),
    ("GET", "/api/policies/{job_type}", VIEWER),
    ("PUT", "/api/policies/{job_type}", OPERATOR),
    ("POST", "/api/scheduler/pause", OPERATOR),
    ("POST", "/api/scheduler/resume", OPERATOR),
    ("POST", "/api/recover", OPERATOR),
    ("POST", "/api/prune", OPERATOR),
    ("POST", "/api/detect/{job_type}", OPERATOR),
    ("GET", "/api/audit", ADMIN),
    ("GET", "/api/notifications", VIEWER),
    ("GET", "/metrics", VIEWER),
    ("GET", "/api/windows", VIEWER),
    ("GET", "/api/budget", VIEWER),
    ("PUT", "/api/budget", OPERATOR),
    ("GET", "/api/schedules", VIEWER),
    ("POST", "/api/schedules", OPERATOR),
    ("DELETE", "/api/schedules/{name}", OPERATOR),
    ("POST", "/api/schedules/{name}/pause", OPERATOR),
    ("POST", "/api/schedules/{name}/resume", OPERATOR),
    ("POST", "/api/schedules/{name}/run-now", OPERATOR),
];

/// Every gRPC method: its path (`/package.Service/Method`), need.
pub const GRPC: &[(&str, Need)] = &[
    ("/jobcenter.v1.JobService/SubmitJob", OPERATOR),
    ("/jobcenter.v1.JobService/SubmitJobStream", OPERATOR),
    ("/jobcenter.v1.JobService/GetJob", VIEWER),
    ("/jobcenter.v1.JobService/ReadJob", VIEWER),
    ("/jobcenter.v1.JobService/ListJobs", VIEWER),
    ("/jobcenter.v1.JobService/WatchJob", VIEWER),
    ("/jobcenter.v1.JobService/WaitJob", VIEWER),
    ("/jobcenter.v1.JobService/CancelJob", OPERATOR_OR_INSTANCE),
    ("/jobcenter.v1.JobService/RetryJob", OPERATOR),
    ("/jobcenter.v1.JobService/ListWorkers", VIEWER),
    ("/jobcenter.v1.JobService/GetPolicy", VIEWER),
    ("/jobcenter.v1.JobService/SetPolicy", OPERATOR),
    ("/jobcenter.v1.JobService/Recover", OPERATOR_OR_INSTANCE),
    ("/jobcenter.v1.JobService/Detect", OPERATOR),
    ("/jobcenter.v1.JobService/ListActivities", VIEWER),
    ("/jobcenter.v1.JobService/ListRuns", VIEWER),
    ("/jobcenter.v1.JobService/ListInstances", VIEWER),
    ("/jobcenter.v1.JobService/GetCapacity", VIEWER),
    ("/jobcenter.v1.JobService/SetSchedulerPaused", OPERATOR),
    ("/jobcenter.v1.JobService/Prune", OPERATOR),
    ("/jobcenter.v1.JobService/Backup", ADMIN),
    ("/jobcenter.v1.JobService/ListAudit", ADMIN),
    ("/jobcenter.v1.JobService/ListNotifications", VIEWER),
    ("/jobcenter.v1.JobService/SetJobPriority", OPERATOR_OR_INSTANCE),
    ("/jobcenter.v1.JobService/ListWindows", VIEWER),
    ("/jobcenter.v1.JobService/AddSchedule", OPERATOR),
    ("/jobcenter.v1.JobService/ListSchedules", VIEWER),
    ("/jobcenter.v1.JobService/SetSchedulePaused", OPERATOR),
    ("/jobcenter.v1.JobService/RemoveSchedule", OPERATOR),
    ("/jobcenter.v1.JobService/RunScheduleNow", OPERATOR),
    ("/plugin.PluginControlService/WorkerStream", WORKER),
    ("/jobcenter.peer.v1.PeerService/Lend", INSTANCE),
    ("/jobcenter.peer.v1.PeerService/Report", INSTANCE),
    ("/jobcenter.peer.v1.PeerService/Reports", INSTANCE),
    ("/jobcenter.peer.v1.PeerService/Cancel", INSTANCE),
    ("/jobcenter.peer.v1.PeerService/Knows", INSTANCE),
    ("/jobcenter.peer.v1.PeerService/DedupeKeys", INSTANCE),
    ("/jobcenter.peer.v1.PeerService/Vouch", INSTANCE),
    ("/jobcenter.v1.JobService/GetBudget", VIEWER),
    ("/jobcenter.v1.JobService/SetBudget", OPERATOR),
];

/// What an HTTP route needs (`HEAD` as `GET`); admin for a route without a row.
pub(crate) fn http(method: &Method, path: &str) -> Need {
    let method = if *method == Method::HEAD { "GET" } else { method.as_str() };
    HTTP.iter().find(|(m, p, _)| *m == method && *p == path).map_or(ADMIN, |(_, _, need)| *need)
}

/// What a gRPC method needs; admin for a method without a row.
pub(crate) fn grpc(path: &str) -> Need {
    GRPC.iter().find(|(p, _)| *p == path).map_or(ADMIN, |(_, need)| *need)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;

    fn rows() -> BTreeSet<(String, String)> {
        HTTP.iter().map(|(m, p, _)| (m.to_string(), p.to_string())).collect()
    }

    #[test]
    fn each_route_has_one_row_and_only_reads_are_open_to_viewers() {
        assert_eq!(rows().len(), HTTP.len(), "a route is given twice");
        let methods: BTreeSet<&str> = GRPC.iter().map(|(p, _)| *p).collect();
        assert_eq!(methods.len(), GRPC.len(), "a method is given twice");
        for (method, path, need) in HTTP {
            if *need == VIEWER {
                assert_eq!(*method, "GET", "{path}: a viewer only reads");
            }
        }
        assert_eq!(http(&Method::HEAD, "/api/jobs"), VIEWER);
        assert_eq!(http(&Method::GET, "/api/not-in-the-table"), ADMIN);
        assert_eq!(grpc("/jobcenter.v1.JobService/NotInTheTable"), ADMIN);
    }

    /// `openapi.json` documents every route: each has its row, and the
    /// table holds no other.
    #[test]
    fn the_table_and_the_openapi_document_name_the_same_routes() {
        let document: serde_json::Value =
            serde_json::from_str(include_str!("../openapi.json")).expect("openapi.json is JSON");
        let mut documented = BTreeSet::new();
        for (path, item) in document["paths"].as_object().expect("paths") {
            for method in item.as_object().expect("path item").keys() {
                if ["get", "post", "put", "delete", "patch"].contains(&method.as_str()) {
                    documented.insert((method.to_uppercase(), path.clone()));
                }
            }
        }
        let tabled = rows();
        assert_eq!(
            documented.difference(&tabled).collect::<Vec<_>>(),
            Vec::<&(String, String)>::new(),
            "documented, with no row in the table"
        );
        assert_eq!(
            tabled.difference(&documented).collect::<Vec<_>>(),
            Vec::<&(String, String)>::new(),
            "in the table, not documented"
        );
    }

    /// Every `rpc` of the services the server serves has its row, and the
    /// table names no method that is not one.
    #[test]
    fn the_table_names_every_method_of_the_served_services() {
        let mut declared = BTreeSet::new();
        for (file, services) in [
            (include_str!("../../../../proto/jobcenter.proto"), &["JobService"][..]),
            (include_str!("../../../../proto/plugin.proto"), &["PluginControlService"][..]),
            (include_str!("../../../../proto/peer.proto"), &["PeerService"][..]),
        ] {
            let package = file
                .lines()
                .find_map(|l| l.trim().strip_prefix("package "))
                .map(|p| p.trim_end_matches(';').trim())
                .expect("a package");
            let mut service = None;
            for line in file.lines().map(str::trim) {
                if let Some(rest) = line.strip_prefix("service ") {
                    service = rest.split_whitespace().next().map(str::to_string);
                } else if let Some(rest) = line.strip_prefix("rpc ") {
                    let name = rest.split('(').next().expect("rpc name").trim();
                    let service = service.clone().expect("an rpc inside a service");
                    if services.contains(&service.as_str()) {
                        declared.insert(format!("/{package}.{service}/{name}"));
                    }
                }
            }
        }
        let tabled: BTreeSet<String> = GRPC.iter().map(|(p, _)| p.to_string()).collect();
        assert!(declared.len() > 25, "the proto files were read: {declared:?}");
        assert_eq!(declared, tabled);
    }
}
