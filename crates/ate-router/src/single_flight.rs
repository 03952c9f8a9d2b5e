//! Concurrent lookups of one actor share one in-flight resolution: the first request starts it
//! (in a task of its own, so no request's cancellation cancels it) and everyone watches its
//! progress through a `watch` channel until it publishes its result.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};

use tokio::sync::watch;

use crate::actor_ref::ActorKey;

pub struct SingleFlight<S> {
    flights: Mutex<HashMap<ActorKey, watch::Receiver<S>>>,
}

impl<S> Default for SingleFlight<S> {
    fn default() -> Self {
        Self {
            flights: Mutex::new(HashMap::new()),
        }
    }
}

impl<S: Default> SingleFlight<S> {
    /// Joins `actor`'s flight, or starts one. Under the map's lock and only when no flight exists,
    /// `ready` may answer without a flight (a re-check of the cache closes the race with a flight
    /// that just finished); otherwise `start` is given the flight's sender and must arrange for
    /// [`SingleFlight::finish`] once the result is published.
    pub fn join_or_start(
        &self,
        actor: &str,
        ready: impl FnOnce() -> Option<S>,
        start: impl FnOnce(ActorKey, watch::Sender<S>),
    ) -> watch::Receiver<S> {
        let mut flights = self.flights.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(rx) = flights.get(actor) {
            return rx.clone();
        }
        if let Some(state) = ready() {
            return watch::channel(state).1;
        }
        let key = ActorKey::from_validated(actor);
        let (tx, rx) = watch::channel(S::default());
        flights.insert(key.clone(), rx.clone());
        drop(flights);
        start(key, tx);
        rx
    }

    /// Forgets `actor`'s flight; later lookups start a new one.
    pub fn finish(&self, actor: &str) {
        self.flights
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(actor);
    }

    pub fn in_flight(&self) -> usize {
        self.flights
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    #[tokio::test]
    async fn fifty_joiners_share_one_flight() {
        let sf: Arc<SingleFlight<Option<u32>>> = Arc::default();
        let started = Arc::new(AtomicUsize::new(0));
        let mut waiters = Vec::new();
        for _ in 0..50 {
            let sf2 = sf.clone();
            let started = started.clone();
            let mut rx = sf.join_or_start(
                "a/b",
                || None,
                move |key, tx| {
                    started.fetch_add(1, Ordering::SeqCst);
                    tokio::spawn(async move {
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        let _ = tx.send(Some(7));
                        sf2.finish(key.as_str());
                    });
                },
            );
            waiters.push(tokio::spawn(async move {
                *rx.wait_for(|v| v.is_some()).await.unwrap()
            }));
        }
        for w in waiters {
            assert_eq!(w.await.unwrap(), Some(7));
        }
        assert_eq!(started.load(Ordering::SeqCst), 1);
        assert_eq!(sf.in_flight(), 0);
    }

    #[tokio::test]
    async fn ready_answer_skips_the_flight() {
        let sf: SingleFlight<Option<u32>> = SingleFlight::default();
        let rx = sf.join_or_start("a/b", || Some(Some(3)), |_, _| panic!("no flight"));
        assert_eq!(*rx.borrow(), Some(3));
        assert_eq!(sf.in_flight(), 0);
    }
}
