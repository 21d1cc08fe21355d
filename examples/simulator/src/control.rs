//! The simulator-only `/sim/*` endpoints for tests and demos.

use hyper::{Response, StatusCode};
use serde::Serialize;

use crate::app::App;
use crate::engine::Totals;
use crate::errors::ApiError;
use crate::metrics::MetricsOverride;
use crate::respond::{self, Body};

/// `PUT /sim/metrics-override`: pins the given values in `/metrics`
/// (replacing any earlier override) and echoes the override.
pub fn set_override(app: &App, pinned: MetricsOverride) -> Result<Response<Body>, ApiError> {
    let pinned = pinned.validated()?;
    *app.metrics_override() = pinned;
    Ok(respond::json(StatusCode::OK, &pinned))
}

/// `DELETE /sim/metrics-override`: `/metrics` reports real values again.
pub fn clear_override(app: &App) -> Response<Body> {
    let pinned = MetricsOverride::default();
    *app.metrics_override() = pinned;
    respond::json(StatusCode::OK, &pinned)
}

/// The body of `GET /sim/stats`: the real (never overridden) engine state.
#[derive(Debug, Serialize)]
struct Stats {
    #[serde(flatten)]
    totals: Totals,
    running: usize,
    waiting: usize,
}

/// `GET /sim/stats`.
pub fn stats(app: &App) -> Response<Body> {
    let snapshot = app.engine.snapshot();
    let stats = Stats {
        totals: snapshot.totals,
        running: snapshot.running,
        waiting: snapshot.waiting,
    };
    respond::json(StatusCode::OK, &stats)
}
