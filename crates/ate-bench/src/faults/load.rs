//! The client load (one sequential client per actor through the router), the container sampler
//! that runs beside it, and what their samples say (counts lost or skipped, unavailability).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use tokio::task::JoinSet;

use super::ATESPACE;
use super::checks::Layout;

/// One request's budget: longer than the router's parking budget, so a parked request is seen
/// with the router's own answer rather than as our timeout.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(15);
/// Pause between two requests of one client loop.
const REQUEST_PAUSE: Duration = Duration::from_millis(50);
/// How often the double-activation sampler lists the containers during the run.
const SAMPLE_EVERY: Duration = Duration::from_secs(1);

/// When an actor was seen running on which workers (more than one).
type Sighting = (f64, String, Vec<String>);

/// Lists the containers every `SAMPLE_EVERY` during the whole run and records actors running on
/// two workers at once, including ones that are gone again by the time a fault's checks run;
/// beside it, asks the current api every `SAMPLE_EVERY` for workers marked GONE while their
/// sandboxes run.
pub(super) struct Sampler {
    seen: Arc<Mutex<Vec<Sighting>>>,
    gone: Arc<Mutex<Vec<(f64, String)>>>,
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<()>,
    gone_task: tokio::task::JoinHandle<()>,
}

impl Sampler {
    /// `api` names the current api (updated by each new `ate up`), `state` holds the admin
    /// certificate.
    pub(super) fn start(
        layout: Layout,
        clock: Clock,
        state: std::path::PathBuf,
        api: Arc<Mutex<String>>,
    ) -> Sampler {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let gone = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let task = tokio::spawn({
            let (seen, stop, layout) = (seen.clone(), stop.clone(), layout.clone());
            async move {
                while !stop.load(Ordering::Relaxed) {
                    if let Ok(c) = layout.containers().await {
                        let now = clock.now();
                        let doubles = layout.double_activations(&c);
                        lock(&seen).extend(doubles.into_iter().map(|(a, w)| (now, a, w)));
                    }
                    tokio::time::sleep(SAMPLE_EVERY).await;
                }
            }
        });
        let gone_task = tokio::spawn({
            let (gone, stop) = (gone.clone(), stop.clone());
            async move {
                while !stop.load(Ordering::Relaxed) {
                    let addr = lock(&api).clone();
                    if !addr.is_empty() {
                        let client = super::lab::connect_api(&state, &addr).await;
                        // An api that is not there (a restart) is simply not asked this time.
                        if let Ok(found) =
                            super::checks::gone_with_sandboxes(&client, &layout).await
                        {
                            let now = clock.now();
                            lock(&gone).extend(found.into_iter().map(|g| (now, g)));
                        }
                    }
                    tokio::time::sleep(SAMPLE_EVERY).await;
                }
            }
        });
        Sampler {
            seen,
            gone,
            stop,
            task,
            gone_task,
        }
    }

    /// Distinct findings of workers gone with running sandboxes within `(from, to]`.
    pub(super) fn gone_between(&self, from: f64, to: f64) -> Vec<String> {
        let mut out: Vec<String> = Vec::new();
        for (t, g) in lock(&self.gone).iter() {
            if *t > from && *t <= to && !out.contains(g) {
                out.push(g.clone());
            }
        }
        out
    }

    /// Distinct actors seen on two workers within `(from, to]`, with the workers.
    pub(super) fn seen_between(&self, from: f64, to: f64) -> Vec<(String, Vec<String>)> {
        let mut by_actor: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for (t, a, ws) in lock(&self.seen).iter() {
            if *t > from && *t <= to {
                by_actor.entry(a.clone()).or_insert_with(|| ws.clone());
            }
        }
        by_actor.into_iter().collect()
    }

    pub(super) async fn stop(mut self) {
        self.stop.store(true, Ordering::Relaxed);
        let _ = (&mut self.task).await;
        let _ = (&mut self.gone_task).await;
    }
}

/// An interrupted suite drops the sampler without `stop`: its tasks must not outlive it.
impl Drop for Sampler {
    fn drop(&mut self) {
        self.task.abort();
        self.gone_task.abort();
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Seconds since the suite started: the time axis of every sample and event.
#[derive(Clone, Copy)]
pub(super) struct Clock(pub(super) Instant);

impl Clock {
    pub(super) fn now(self) -> f64 {
        self.0.elapsed().as_secs_f64()
    }
}

/// One request of a client loop.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) struct Sample {
    pub(super) start: f64,
    end: f64,
    /// HTTP status; 0 for a transport error or our timeout.
    pub(super) status: u16,
    /// The memory count of a 200.
    count: Option<u64>,
}

type HttpClient = Client<HttpConnector, Empty<Bytes>>;

/// One sequential client per actor, recording every request.
pub(super) struct Load {
    pub(super) actors: Vec<String>,
    history: Arc<Vec<Mutex<Vec<Sample>>>>,
    stop: Arc<AtomicBool>,
    tasks: JoinSet<()>,
}

impl Load {
    pub(super) fn start(router: &str, actors: &[String], clock: Clock) -> Load {
        let mut conn = HttpConnector::new();
        conn.set_nodelay(true);
        let http: HttpClient = Client::builder(TokioExecutor::new()).build(conn);
        let history: Arc<Vec<Mutex<Vec<Sample>>>> =
            Arc::new(actors.iter().map(|_| Mutex::new(Vec::new())).collect());
        let stop = Arc::new(AtomicBool::new(false));
        let mut tasks = JoinSet::new();
        for (i, name) in actors.iter().enumerate() {
            let (http, history, stop) = (http.clone(), history.clone(), stop.clone());
            let url = format!("{}/", router.trim_end_matches('/'));
            let target = format!("{ATESPACE}/{name}");
            tasks.spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    let start = clock.now();
                    let (status, count) = get_count(&http, &url, &target).await;
                    let end = clock.now();
                    lock(&history[i]).push(Sample {
                        start,
                        end,
                        status,
                        count,
                    });
                    tokio::time::sleep(REQUEST_PAUSE).await;
                }
            });
        }
        Load {
            actors: actors.to_vec(),
            history,
            stop,
            tasks,
        }
    }

    /// A copy of every actor's samples so far.
    pub(super) fn samples(&self) -> Vec<Vec<Sample>> {
        self.history.iter().map(|h| lock(h).clone()).collect()
    }

    /// Waits until every actor has a 200 to a request sent at or after `since`; returns when
    /// the last of them arrived, or the actors still missing after `timeout`.
    pub(super) async fn wait_answered(
        &self,
        since: f64,
        timeout: Duration,
    ) -> Result<f64, Vec<String>> {
        self.wait_answered_by(&self.actors, since, timeout).await
    }

    pub(super) async fn wait_answered_by(
        &self,
        actors: &[String],
        since: f64,
        timeout: Duration,
    ) -> Result<f64, Vec<String>> {
        let deadline = Instant::now() + timeout;
        loop {
            let mut missing = Vec::new();
            let mut last = since;
            for a in actors {
                let Some(i) = self.actors.iter().position(|x| x == a) else {
                    continue;
                };
                let first = lock(&self.history[i])
                    .iter()
                    .find(|s| s.status == 200 && s.start >= since)
                    .map(|s| s.end);
                match first {
                    Some(t) => last = last.max(t),
                    None => missing.push(a.clone()),
                }
            }
            if missing.is_empty() {
                return Ok(last);
            }
            if Instant::now() >= deadline {
                return Err(missing);
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    pub(super) async fn stop(mut self) {
        self.stop.store(true, Ordering::Relaxed);
        while self.tasks.join_next().await.is_some() {}
    }
}

/// One `GET /` through the router: the status and the memory count of a 200 (status 0 for a
/// transport error or after `REQUEST_TIMEOUT`).
async fn get_count(http: &HttpClient, url: &str, target: &str) -> (u16, Option<u64>) {
    let request = async {
        let req = hyper::Request::get(url)
            .header("ate-target-actor", target)
            .body(Empty::new())?;
        let resp = http.request(req).await?;
        let status = resp.status().as_u16();
        let body = resp.into_body().collect().await?.to_bytes();
        anyhow::Ok((status, String::from_utf8_lossy(&body).into_owned()))
    };
    match tokio::time::timeout(REQUEST_TIMEOUT, request).await {
        Ok(Ok((200, body))) => (200, memory_count(&body)),
        Ok(Ok((status, _))) => (status, None),
        Ok(Err(_)) | Err(_) => (0, None),
    }
}

/// N of the counter's `preserved memory count: N | …`.
fn memory_count(body: &str) -> Option<u64> {
    let rest = body.split("preserved memory count:").nth(1)?.trim_start();
    let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
    digits.parse().ok()
}

/// An actor's memory count that did not follow the one before it by exactly 1.
#[derive(Clone, Debug, PartialEq)]
pub(super) struct CountEvent {
    pub(super) actor: String,
    pub(super) at: f64,
    pub(super) previous: u64,
    pub(super) got: u64,
}

/// State lost (a count ≤ the last one seen) and replies lost (a count more than 1 ahead: a
/// request executed whose answer never came back) in one actor's history.
pub(super) fn count_events(actor: &str, samples: &[Sample]) -> (Vec<CountEvent>, Vec<CountEvent>) {
    let (mut lost, mut skipped) = (Vec::new(), Vec::new());
    let mut last: Option<u64> = None;
    for s in samples.iter().filter(|s| s.status == 200) {
        let Some(got) = s.count else { continue };
        if let Some(previous) = last {
            let event = CountEvent {
                actor: actor.to_string(),
                at: s.end,
                previous,
                got,
            };
            if got <= previous {
                lost.push(event);
            } else if got > previous + 1 {
                skipped.push(event);
            }
        }
        last = Some(got);
    }
    (lost, skipped)
}

/// The longest time between two 200s of one actor around the window `[from, to]`: from the last
/// 200 before `from` to the end of the window (which is at least that long for an actor that
/// never answered again).
pub(super) fn longest_gap(samples: &[Sample], from: f64, to: f64) -> f64 {
    let oks: Vec<f64> = samples
        .iter()
        .filter(|s| s.status == 200)
        .map(|s| s.end)
        .collect();
    let anchor = oks
        .iter()
        .rev()
        .find(|&&t| t < from)
        .copied()
        .unwrap_or(from);
    let mut points = vec![anchor];
    points.extend(oks.iter().copied().filter(|&t| t >= from && t <= to));
    points.push(to);
    points.windows(2).map(|w| w[1] - w[0]).fold(0.0, f64::max)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(at: f64, count: u64) -> Sample {
        Sample {
            start: at - 0.01,
            end: at,
            status: 200,
            count: Some(count),
        }
    }

    fn failed(at: f64, status: u16) -> Sample {
        Sample {
            start: at - 0.01,
            end: at,
            status,
            count: None,
        }
    }

    #[test]
    fn memory_count_is_read_from_the_counter_body() {
        let body =
            "preserved memory count: 42 | preserved file counter: 7 | preserved rootfs counter: 3";
        assert_eq!(memory_count(body), Some(42));
        assert_eq!(memory_count("no worker has room"), None);
    }

    #[test]
    fn a_count_that_goes_back_is_state_lost_and_a_jump_is_a_lost_reply() {
        let samples = [
            ok(1.0, 1),
            ok(2.0, 2),
            failed(3.0, 502),
            ok(4.0, 4),
            ok(5.0, 1),
            ok(6.0, 2),
        ];
        let (lost, skipped) = count_events("a", &samples);
        assert_eq!(lost.len(), 1);
        assert_eq!((lost[0].previous, lost[0].got, lost[0].at), (4, 1, 5.0));
        assert_eq!(skipped.len(), 1);
        assert_eq!((skipped[0].previous, skipped[0].got), (2, 4));
    }

    #[test]
    fn longest_gap_runs_from_the_last_answer_before_the_window() {
        let samples = [ok(1.0, 1), failed(2.0, 502), ok(4.5, 2), ok(5.0, 3)];
        assert!((longest_gap(&samples, 1.5, 6.0) - 3.5).abs() < 1e-9);
        // Never answered again: the gap runs to the window's end.
        assert!((longest_gap(&samples[..2], 1.5, 9.0) - 8.0).abs() < 1e-9);
    }
}
