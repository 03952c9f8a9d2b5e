//! Finding (or waking) the actor of a request: assignment cache → one shared resolution per actor
//! (single flight) → ResumeActor with parking and retries, exactly as spec 4.4 says.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use tokio::sync::watch;

use crate::actor_ref::ActorKey;
use crate::api::{Resume, Resumed};
use crate::cache::{AssignmentCache, Route};
use crate::error::{Disposition, ResolveError, classify};
use crate::metrics::{RESUME_CALLS, Stats};
use crate::parking::{self, Outcome, ParkingLot, ParkingPlace};
use crate::single_flight::SingleFlight;

/// Progress of one actor's resolution, watched by every request for that actor.
#[derive(Debug, Clone, Default)]
pub enum FlightState {
    /// The first ResumeActor attempt is running.
    #[default]
    Resolving,
    /// An attempt failed with a result that is retried; `parks` = waiting takes a parking place.
    Waiting {
        parks: bool,
    },
    Done(Result<Resumed, ResolveError>),
}

/// Value of the `ate-resume` response header; ordered so a retry keeps the slowest kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum ResumeKind {
    /// Cache hit, or ResumeActor found the actor running.
    Warm,
    /// This request waited for a ResumeActor that woke the actor.
    Cold,
    /// This request had to wait in parking (or through retries).
    Parked,
}

impl ResumeKind {
    pub fn header_value(self) -> &'static str {
        match self {
            ResumeKind::Warm => "warm",
            ResumeKind::Cold => "cold",
            ResumeKind::Parked => "parked",
        }
    }
}

#[derive(Debug, Clone)]
pub struct ResolveConfig {
    pub budget: Duration,
    /// The decision gives up at budget + grace.
    pub decision_grace: Duration,
    pub unparked_abort_window: Duration,
    pub retry_initial: Duration,
}

/// How long after its expiry a cached route may still be used while the api is unavailable.
const LAST_KNOWN_MAX_STALE: Duration = Duration::from_secs(300);
/// How long a ResumeActor may go unanswered before a last known route is used instead.
const LAST_KNOWN_AFTER: Duration = Duration::from_secs(1);

pub struct Resolver {
    pub cache: AssignmentCache,
    flights: SingleFlight<FlightState>,
    api: Arc<dyn Resume>,
    lot: ParkingLot,
    cfg: ResolveConfig,
    stats: Arc<Stats>,
}

impl Resolver {
    pub fn new(
        cache: AssignmentCache,
        api: Arc<dyn Resume>,
        lot: ParkingLot,
        cfg: ResolveConfig,
        stats: Arc<Stats>,
    ) -> Arc<Self> {
        Arc::new(Self {
            cache,
            flights: SingleFlight::default(),
            api,
            lot,
            cfg,
            stats,
        })
    }

    /// The parking budget (`--parked-request-budget`); zero when parking is off.
    pub fn budget(&self) -> Duration {
        self.cfg.budget
    }

    /// The first retry delay of parked work.
    pub fn retry_initial(&self) -> Duration {
        self.cfg.retry_initial
    }

    /// The route of `actor` (`<atespace>/<name>`, already validated) for the request with id
    /// `request_id`. A resolution this request starts sends that id to the api and runs in the
    /// request's tracing span; one it joins keeps those of the request that started it.
    pub async fn resolve(
        self: &Arc<Self>,
        actor: &str,
        request_id: &str,
    ) -> Result<(Arc<Route>, ResumeKind), ResolveError> {
        if let Some(route) = self.cache.get(actor) {
            return Ok((route, ResumeKind::Warm));
        }
        let decision_deadline =
            tokio::time::Instant::now() + self.cfg.budget + self.cfg.decision_grace;
        let mut started = false;
        let mut rx = self.flights.join_or_start(
            actor,
            || {
                self.cache.get(actor).map(|route| {
                    FlightState::Done(Ok(Resumed {
                        route,
                        resumed: false,
                    }))
                })
            },
            |key, tx| {
                use tracing::Instrument;
                started = true;
                let id = (!request_id.is_empty()).then(|| request_id.to_string());
                tokio::spawn(self.clone().run_flight(key, tx, id).in_current_span());
            },
        );

        // Trace spans (disabled when traces are off): waiting for the actor's one resolution,
        // started here or joined, and within it the time holding a parking place. Never entered:
        // each lasts from its creation until this future ends.
        let _wait = ate_telemetry::trace_span!("single_flight_wait", joined = !started);
        let mut parked = tracing::Span::none();
        // Held while this request waits after a failed attempt; dropped with this future.
        let mut place: Option<ParkingPlace> = None;
        let mut waited = false;
        loop {
            let state = rx.borrow_and_update().clone();
            match state {
                FlightState::Done(result) => {
                    let outcome = match &result {
                        Ok(_) => Outcome::Served,
                        Err(
                            ResolveError::NoRoom
                            | ResolveError::ApiUnavailable
                            | ResolveError::Busy(_),
                        ) => Outcome::Timeout,
                        Err(_) => Outcome::Error,
                    };
                    if let Some(place) = place.take() {
                        place.finish(outcome);
                    }
                    drop(parked);
                    return result.map(|r| {
                        let kind = if waited {
                            ResumeKind::Parked
                        } else if r.resumed {
                            ResumeKind::Cold
                        } else {
                            ResumeKind::Warm
                        };
                        (r.route, kind)
                    });
                }
                FlightState::Waiting { parks } => {
                    waited = true;
                    if parks && place.is_none() {
                        let atespace = actor.split_once('/').map_or(actor, |(a, _)| a);
                        match self.lot.try_park(atespace) {
                            Some(p) => {
                                place = Some(p);
                                parked = ate_telemetry::trace_span!("parked");
                            }
                            None => return Err(ResolveError::AtCapacity),
                        }
                    }
                }
                FlightState::Resolving => {}
            }
            let shed = async {
                match &place {
                    Some(p) => p.shed().await,
                    None => std::future::pending().await,
                }
            };
            let changed = tokio::select! {
                changed = tokio::time::timeout_at(decision_deadline, rx.changed()) => changed,
                // Its place went to an atespace below its fair share: the lot-full answer.
                () = shed => return Err(ResolveError::AtCapacity),
            };
            match changed {
                Ok(Ok(())) => {}
                Ok(Err(_)) => {
                    return Err(ResolveError::Internal(
                        "resolution ended without a result".into(),
                    ));
                }
                Err(_) => {
                    // The flight goes on (a started resume is never cancelled) and fills the
                    // cache for the client's next try.
                    if let Some(place) = place.take() {
                        place.finish(Outcome::Timeout);
                    }
                    return Err(ResolveError::DecisionTimeout);
                }
            }
        }
    }

    /// Forgets a route that atunnel called stale.
    pub fn evict_stale(&self, actor: &str, route: &Arc<Route>) {
        self.cache.evict_stale(actor, route);
    }

    pub fn in_flight(&self) -> usize {
        self.flights.in_flight()
    }

    pub fn parking_enabled(&self) -> bool {
        self.lot.enabled()
    }

    async fn run_flight(
        self: Arc<Self>,
        key: ActorKey,
        tx: watch::Sender<FlightState>,
        request_id: Option<String>,
    ) {
        let result = self.attempts(&key, &tx, request_id.as_deref()).await;
        if let Ok(resumed) = &result {
            self.cache.insert(key.clone(), resumed.route.clone());
        }
        tx.send_replace(FlightState::Done(result));
        self.flights.finish(key.as_str());
    }

    /// ResumeActor until it answers something final. The budget clock starts with the first
    /// failed attempt; an attempt that has started always runs to its end.
    async fn attempts(
        &self,
        key: &ActorKey,
        tx: &watch::Sender<FlightState>,
        request_id: Option<&str>,
    ) -> Result<Resumed, ResolveError> {
        let parking = self.lot.enabled();
        let mut deadline: Option<Instant> = None;
        let mut backoff = parking::backoff(self.cfg.retry_initial);
        let mut attempt = 0u32;
        loop {
            use tracing::Instrument;
            self.stats.resume_calls.fetch_add(1, Ordering::Relaxed);
            metrics::counter!(RESUME_CALLS).increment(1);
            attempt += 1;
            // The call's span is the api's parent (its `traceparent` metadata).
            let span = ate_telemetry::trace_span!("ResumeActor", attempt, otel.kind = "client");
            let call = span.in_scope(|| self.api.resume(key, request_id));
            let call = call.instrument(span);
            // With a last known route, an api that does not answer at all (hung, stopped,
            // unreachable without a reset) is not waited for past a second either.
            let answer = match self.cache.last_known(key.as_str(), LAST_KNOWN_MAX_STALE) {
                Some(route) => match tokio::time::timeout(LAST_KNOWN_AFTER, call).await {
                    Ok(answer) => answer,
                    Err(_) => {
                        tracing::debug!(actor = %key, "api did not answer; using the last known route");
                        return Ok(Resumed {
                            route,
                            resumed: false,
                        });
                    }
                },
                None => call.await,
            };
            let status = match answer {
                Ok(resumed) => return Ok(resumed),
                Err(status) => status,
            };
            // The api cannot be asked (restarting, its store down): an actor that was running a
            // moment ago most likely still is, and atunnel's fencing refuses the route if not.
            if status.code() == tonic::Code::Unavailable
                && let Some(route) = self.cache.last_known(key.as_str(), LAST_KNOWN_MAX_STALE)
            {
                tracing::debug!(actor = %key, error = %status.message(), "api unavailable; using the last known route");
                return Ok(Resumed {
                    route,
                    resumed: false,
                });
            }
            let (parks, if_exhausted) = match classify(&status, parking) {
                Disposition::Fail(e) => {
                    if let ResolveError::Internal(detail) = &e {
                        tracing::warn!(actor = %key, %detail, "ResumeActor failed");
                    }
                    return Err(e);
                }
                Disposition::Retry {
                    parks,
                    if_exhausted,
                } => (parks, if_exhausted),
            };
            let now = Instant::now();
            let deadline = *deadline.get_or_insert_with(|| {
                now + if parks {
                    self.cfg.budget
                } else {
                    self.cfg.unparked_abort_window
                }
            });
            if now >= deadline {
                return Err(if_exhausted);
            }
            tx.send_if_modified(|state| match state {
                FlightState::Waiting { parks: p } if *p == parks => false,
                _ => {
                    *state = FlightState::Waiting { parks };
                    true
                }
            });
            let wake = (now + backoff.next_delay(rand::random())).min(deadline);
            tokio::time::sleep_until(wake.into()).await;
            if Instant::now() >= deadline {
                tracing::debug!(actor = %key, code = ?status.code(), "park budget spent");
                return Err(if_exhausted);
            }
        }
    }
}
