//! The filter's root context: it owns this worker's [`Worker`], hands it to every HTTP
//! context, and runs its slow timer tick — the exchange's heartbeat (which also checks for a
//! snapshot whose notice was missed) and, when the configuration names a controller cluster,
//! the leased poller.

use std::cell::RefCell;
use std::rc::Rc;
use std::time::Duration;

use proxy_wasm::hostcalls;

use super::flow;
use super::http::PickerHttp;
use super::leased_poller::LeasedPoller;
use super::shared;
use super::worker::Worker;
use crate::exchange;
use crate::plugin_config::FilterConfig;

/// The worker's tick: the exchange's heartbeat, and a new snapshot decoded off the request
/// path when no request has read it yet. Records and in-flight changes do not wait for it
/// (they are pushed through the peers' queues as decisions happen), so it can be slow: a tick
/// costs Envoy about 0.2 ms of CPU on the 2-core benchmark VM even when the callback returns
/// at once (measured: an idle Envoy used 26 ms/s with an empty 10 ms tick, 6 ms/s with a 1 s
/// one), which at 10 ms was more than the requests themselves cost at 100 req/s.
const TICK: Duration = Duration::from_millis(exchange::HEARTBEAT_MS);
/// The first ticks come this often, so workers that start together (and missed each other's
/// registration) find each other within a fraction of a second, not a heartbeat.
const STARTUP_TICK: Duration = Duration::from_millis(100);
/// Startup ticks before the tick slows to its steady period.
const STARTUP_TICKS: u64 = 20;

/// The filter's root context.
pub struct FilterRoot {
    worker: Rc<RefCell<Worker>>,
    /// Filter-side polling (`controllerCluster` configured); `None` with a bootstrap poller.
    poller: Option<LeasedPoller>,
    /// Ticks between two turns of the leased poller (its `retryMs`).
    poller_every: u64,
    /// The tick period after the startup ticks.
    steady_tick: Duration,
    ticks: u64,
    /// When the last (non-flow-control) tick's work ran, ms since the Unix epoch.
    last_tick_ms: u64,
}

impl FilterRoot {
    /// A root context with the given configuration; starts the worker's ticker and its leased
    /// poller, if any.
    pub fn new(config: FilterConfig) -> FilterRoot {
        let poller = config.controller.clone().map(|controller| {
            let mut poller = LeasedPoller::new(controller);
            poller.start();
            poller
        });
        // A leased poller takes its turns at its retry period, which the tick then follows.
        let tick = poller.as_ref().map_or(TICK, |p| {
            TICK.min(Duration::from_millis(p.config().retry_ms.max(10)))
        });
        let poller_every = poller.as_ref().map_or(1, |p| {
            (p.config().retry_ms / tick.as_millis() as u64).max(1)
        });
        if let Err(status) = hostcalls::set_tick_period(STARTUP_TICK.min(tick)) {
            log::error!("wasm-epp: cannot set the tick period: {status:?}");
        }
        let root = FilterRoot {
            steady_tick: tick,
            poller,
            poller_every,
            ticks: 0,
            last_tick_ms: 0,
            worker: Rc::new(RefCell::new(Worker::new(config))),
        };
        // Join the exchange now rather than a heartbeat later: the peers already running
        // learn of this worker from its first message.
        root.worker.borrow_mut().on_tick();
        root
    }

    /// A new HTTP context (context `id`) on this worker.
    pub fn new_http(&self, id: u32) -> PickerHttp {
        PickerHttp::new(id, self.worker.clone())
    }

    /// Learns what the other workers sent to this worker's inbox `queue`, or hands the
    /// record uplink's messages to the leased poller.
    pub fn on_queue_ready(&mut self, queue: u32) {
        if let Some(poller) = self.poller.as_mut() {
            if poller.on_queue_ready(queue) {
                return;
            }
        }
        self.worker.borrow_mut().on_queue_ready(queue);
        // A new snapshot may have freed capacity for waiting requests.
        flow::turn(&self.worker);
    }

    /// The tick period outside flow-control waits.
    fn period(&self) -> Duration {
        if self.ticks < STARTUP_TICKS {
            STARTUP_TICK.min(self.steady_tick)
        } else {
            self.steady_tick
        }
    }

    fn set_period(&self, period: Duration) {
        if let Err(status) = hostcalls::set_tick_period(period) {
            log::error!("wasm-epp: cannot set the tick period: {status:?}");
        }
    }

    /// The leased poller, if this filter polls the controller itself.
    pub fn poller(&mut self) -> Option<&mut LeasedPoller> {
        self.poller.as_mut()
    }

    /// One tick: the worker's sharing and, every `retryMs`, the leased poller's turn; while
    /// requests wait in the flow-control queue, ticks come every [`flow::WAITING_TICK`] for its
    /// turns and the rest keeps its own pace.
    pub fn on_tick(&mut self) {
        let now_ms = shared::now_unix_ms();
        let fast = self.worker.borrow_mut().flow().fast_tick;
        if fast && now_ms.saturating_sub(self.last_tick_ms) < self.period().as_millis() as u64 {
            flow::turn(&self.worker);
            return;
        }
        if fast {
            let slow_again = {
                let mut worker = self.worker.borrow_mut();
                let flow = worker.flow();
                let idle = flow.idle();
                flow.fast_tick = !idle;
                idle
            };
            if slow_again {
                self.set_period(self.period());
            }
        }
        self.last_tick_ms = now_ms;
        if self.ticks == STARTUP_TICKS && !self.worker.borrow_mut().flow().fast_tick {
            self.set_period(self.steady_tick);
        }
        self.worker.borrow_mut().on_tick();
        if self.ticks % self.poller_every == 0 {
            if let Some(poller) = self.poller.as_mut() {
                poller.on_tick();
            }
        }
        self.ticks = self.ticks.wrapping_add(1);
        if fast {
            // Last: a turn leaves the host's effective context on the last stream it touched,
            // and the calls above (the leased poller's HTTP call above all) belong to the root.
            flow::turn(&self.worker);
        }
    }
}
