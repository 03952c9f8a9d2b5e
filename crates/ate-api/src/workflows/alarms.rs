//! Alarm delivery: due alarms are claimed from the store (a lease per claim, so an api that dies
//! mid-delivery leaves them to the next claim, and replicas never deliver one at the same time)
//! and POSTed to their actors through the router's internal listener, which resumes, parks and
//! single-flights them like any request. A 2xx completes the alarm (only the one delivered: the
//! actor may have set another meanwhile); anything else is retried 2 s, 4 s, 8 s, 16 s, 32 s
//! later, six tries in all, then the alarm is kept as failed for `ate get alarms`.
//!
//! At least once: a delivery whose answer is lost (the api killed after the actor answered) is
//! delivered again after the claim's lease. Handlers must be idempotent (docs/actors.md).

use std::sync::Arc;
use std::time::Duration;

use ate_core::clock::now_ms;
use ate_core::platform::{ALARM_ATTEMPT_HEADER, CALLER_ACTOR_HEADER};
use ate_router_client::RouterClient;
use ate_store::Alarm;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};

use super::Api;

/// Tries of one alarm, the first included.
const ALARM_TRIES: u32 = 6;
/// The wait before the first retry; doubled for each one after.
const FIRST_RETRY: Duration = Duration::from_secs(2);
/// How long a claim keeps other claims off an alarm: longer than any delivery may take
/// ([`DELIVERY_TIMEOUT`]), so a delivery under way is not claimed twice.
const CLAIM_LEASE: Duration = Duration::from_secs(90);
/// The longest one delivery may take (resume, parking and the actor's handler included).
const DELIVERY_TIMEOUT: Duration = Duration::from_secs(60);
/// Deliveries under way at once, over all actors: the router parks what it has no room for.
const IN_FLIGHT: usize = 64;
/// How often the store is asked for due alarms when nothing wakes the loop sooner.
const TICK: Duration = Duration::from_millis(250);

/// How a delivery ended.
enum Delivered {
    Done(u16),
    Failed(String),
}

impl Api {
    /// An alarm was set: look for due ones now.
    pub fn alarms_changed(&self) {
        self.alarm_wake.notify_one();
    }

    /// Delivers due alarms through `router` until `stop` changes.
    pub async fn deliver_alarms(
        self: Arc<Self>,
        router: RouterClient<Full<Bytes>>,
        mut stop: tokio::sync::watch::Receiver<bool>,
    ) {
        let slots = Arc::new(tokio::sync::Semaphore::new(IN_FLIGHT));
        loop {
            let room = slots.available_permits();
            let mut full_batch = false;
            if room > 0 {
                let limit = u32::try_from(room).unwrap_or(u32::MAX);
                let lease = i64::try_from(CLAIM_LEASE.as_millis()).unwrap_or(i64::MAX);
                match self.store.claim_due_alarms(now_ms(), lease, limit).await {
                    Ok(due) => {
                        full_batch = due.len() == room;
                        for alarm in due {
                            let Ok(permit) = slots.clone().acquire_owned().await else {
                                return;
                            };
                            let api = self.clone();
                            let router = router.clone();
                            tokio::spawn(async move {
                                api.deliver(&router, alarm).await;
                                drop(permit);
                            });
                        }
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "claiming due alarms failed; trying again")
                    }
                }
            }
            if full_batch {
                continue;
            }
            tokio::select! {
                () = tokio::time::sleep(TICK) => {}
                () = self.alarm_wake.notified() => {}
                _ = stop.changed() => return,
            }
        }
    }

    async fn deliver(&self, router: &RouterClient<Full<Bytes>>, alarm: Alarm) {
        let attempt = alarm.attempts + 1;
        let outcome =
            match tokio::time::timeout(DELIVERY_TIMEOUT, post(router, &alarm, attempt)).await {
                Ok(outcome) => outcome,
                Err(_) => Delivered::Failed(format!("no answer within {DELIVERY_TIMEOUT:?}")),
            };
        let actor = &alarm.actor;
        let late_ms = now_ms().saturating_sub(alarm.due_ms).max(0);
        match outcome {
            Delivered::Done(status) => {
                metrics::counter!("ate_alarms_delivered_total").increment(1);
                metrics::histogram!("ate_alarm_lateness_seconds").record(late_ms as f64 / 1000.0);
                tracing::info!(actor = %actor, attempt, status, late_ms, "alarm delivered");
                if let Err(e) = self.store.delete_alarm(actor, Some(alarm.seq)).await {
                    // Kept: delivered again after the claim's lease (at least once).
                    tracing::warn!(actor = %actor, error = %e, "a delivered alarm could not be removed; it will be delivered again");
                }
            }
            Delivered::Failed(why) => {
                let give_up = attempt >= ALARM_TRIES;
                let wait = FIRST_RETRY.saturating_mul(1 << (attempt - 1).min(16));
                let next =
                    now_ms().saturating_add(i64::try_from(wait.as_millis()).unwrap_or(i64::MAX));
                metrics::counter!("ate_alarm_attempts_failed_total").increment(1);
                if give_up {
                    tracing::warn!(actor = %actor, attempt, error = %why, "alarm failed its last try; given up");
                } else {
                    tracing::info!(actor = %actor, attempt, error = %why, retry_in_ms = wait.as_millis() as u64, "alarm delivery failed; retrying");
                }
                if let Err(e) = self
                    .store
                    .alarm_attempt_failed(actor, alarm.seq, next, &why, give_up)
                    .await
                {
                    tracing::warn!(actor = %actor, error = %e, "recording a failed alarm delivery failed; retried after the claim's lease");
                }
            }
        }
    }
}

/// `POST <path>` to the alarm's actor through the router.
async fn post(router: &RouterClient<Full<Bytes>>, alarm: &Alarm, attempt: u32) -> Delivered {
    let actor = alarm.actor.to_string();
    let request = http::Request::post(alarm.path.as_str())
        .header(ate_core::TARGET_ACTOR_HEADER, actor.as_str())
        // A call from the actor to itself, as far as the router's policy goes.
        .header(CALLER_ACTOR_HEADER, actor.as_str())
        .header(ALARM_ATTEMPT_HEADER, attempt.to_string())
        .header(http::header::CONTENT_LENGTH, "0")
        .body(Full::new(Bytes::new()));
    let request = match request {
        Ok(r) => r,
        Err(e) => return Delivered::Failed(format!("invalid request: {e}")),
    };
    let response = match router.send(request).await {
        Ok(r) => r,
        Err(e) => return Delivered::Failed(format!("router {}: {e}", router.addr())),
    };
    let status = response.status();
    // Read the answer whole (the connection goes back to the pool), keeping a little for errors.
    let body = response
        .into_body()
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    if status.is_success() {
        return Delivered::Done(status.as_u16());
    }
    let text = String::from_utf8_lossy(&body[..body.len().min(300)])
        .trim()
        .to_string();
    Delivered::Failed(format!("{status}: {text}"))
}
