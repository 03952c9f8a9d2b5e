//! ActorService.ListEvents, WatchEvents and WatchActors (`ate get events [--watch]`, `ate get
//! actors --watch`): the actors' recorded changes, read from the store and followed through the
//! api's event feed (`crate::events`). Who may call them: as ListActors (admin, or a client,
//! which sees only its atespaces' actors).

use std::pin::Pin;
use std::sync::Arc;

use ate_core::ActorRef;
use ate_proto::v1;
use ate_store::{ActorEvent, EventQuery, StoreError};
use tokio::sync::{broadcast, mpsc};
use tokio_stream::Stream;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};

use super::{Services, atespace_filter, label};
use crate::authz::{Caller, Need};
use crate::convert::{self, store_status};
use crate::events::{Selector, Sent, backfill};

pub(super) type WatchEventsStream =
    Pin<Box<dyn Stream<Item = Result<v1::ActorEvent, Status>> + Send>>;
pub(super) type WatchActorsStream =
    Pin<Box<dyn Stream<Item = Result<v1::ActorChange, Status>> + Send>>;

/// ListEvents' limit when none is asked for, and the most it gives.
const DEFAULT_LIMIT: u32 = 500;
const MAX_LIMIT: u32 = 5000;
/// Messages a watch buffers for a slow client before it waits for it.
const BUFFER: usize = 256;
/// What a watcher too slow for the feed is told (kubectl's "too old resource version": list
/// again, then watch).
const FELL_BEHIND: &str = "the watch fell behind the events it had to send; list again and watch";

/// The atespace and actor a request selects, validated (a name needs its atespace).
fn selector(atespace: &str, name: &str) -> Result<Selector, Status> {
    let atespace = atespace_filter(atespace)?;
    if !name.is_empty() {
        if atespace.is_none() {
            return Err(Status::invalid_argument(
                "invalid name: naming an actor needs its atespace",
            ));
        }
        label("name", name)?;
    }
    Ok(Selector {
        atespace: atespace.map(str::to_string),
        name: Some(name.to_string()).filter(|n| !n.is_empty()),
    })
}

impl Services {
    pub(super) async fn list_events_rpc(
        &self,
        req: Request<v1::ListEventsRequest>,
    ) -> Result<Response<v1::ListEventsResponse>, Status> {
        let caller = self.authorize(&req, "ActorService/ListEvents", |r| {
            Need::atespace_or_list(&r.atespace)
        })?;
        let req = req.into_inner();
        let selector = selector(&req.atespace, &req.name)?;
        let limit = match req.limit {
            0 => DEFAULT_LIMIT,
            n => n.min(MAX_LIMIT),
        };
        let page = self
            .api
            .store
            .list_events(&EventQuery {
                atespace: selector.atespace,
                name: selector.name,
                after_id: req.after_id.max(0),
                limit,
                newest: true,
            })
            .await
            .map_err(store_status)?;
        Ok(Response::new(v1::ListEventsResponse {
            events: page
                .events
                .iter()
                .filter(|e| caller.sees(&e.atespace))
                .map(convert::event)
                .collect(),
            newest_id: page.newest_id,
        }))
    }

    pub(super) async fn watch_events_rpc(
        &self,
        req: Request<v1::WatchEventsRequest>,
    ) -> Result<Response<WatchEventsStream>, Status> {
        let caller = self.authorize(&req, "ActorService/WatchEvents", |r| {
            Need::atespace_or_list(&r.atespace)
        })?;
        let req = req.into_inner();
        let selector = selector(&req.atespace, &req.name)?;
        // Subscribed before the backfill is read, so nothing committed in between is missed.
        let mut feed = self.api.events.subscribe();
        let store = self.api.store.clone();
        let after_id = match req.after_id {
            id if id > 0 => id,
            // Only new events: start at the newest id now (the feed may bring a few older
            // ones, read before it; they are skipped as backfilled).
            _ => {
                store
                    .list_events(&EventQuery::default())
                    .await
                    .map_err(store_status)?
                    .newest_id
            }
        };
        let first = backfill(store.as_ref(), &selector, after_id)
            .await
            .map_err(store_status)?;
        let (tx, rx) = mpsc::channel(BUFFER);
        tokio::spawn(async move {
            let mut sent = Sent::default();
            for e in first.iter().filter(|e| caller.sees(&e.atespace)) {
                sent.record(e.id);
                if tx.send(Ok(convert::event(e))).await.is_err() {
                    return;
                }
            }
            loop {
                let Some(e) = next(&mut feed, &tx).await else {
                    return;
                };
                let e = match e {
                    Ok(e) => e,
                    Err(status) => {
                        let _ = tx.send(Err(status)).await;
                        return;
                    }
                };
                // At or below the start: what the caller already has (an event that committed
                // out of id order just as the watch began is the one this can miss).
                if e.id <= after_id || sent.already(e.id) {
                    continue;
                }
                if !selector.matches(&e) || !caller.sees(&e.atespace) {
                    continue;
                }
                if tx.send(Ok(convert::event(&e))).await.is_err() {
                    return;
                }
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }

    pub(super) async fn watch_actors_rpc(
        &self,
        req: Request<v1::WatchActorsRequest>,
    ) -> Result<Response<WatchActorsStream>, Status> {
        let caller = self.authorize(&req, "ActorService/WatchActors", |r| {
            Need::atespace_or_list(&r.atespace)
        })?;
        let req = req.into_inner();
        let selector = selector(&req.atespace, "")?;
        let mut feed = self.api.events.subscribe();
        let (tx, rx) = mpsc::channel(BUFFER);
        let services = self.clone();
        tokio::spawn(async move {
            if services
                .send_actors_now(&selector, &caller, &tx)
                .await
                .is_err()
            {
                return;
            }
            let synced = v1::ActorChange {
                synced: true,
                ..v1::ActorChange::default()
            };
            if tx.send(Ok(synced)).await.is_err() {
                return;
            }
            loop {
                let e = match next(&mut feed, &tx).await {
                    None => return,
                    Some(Ok(e)) => e,
                    Some(Err(status)) => {
                        let _ = tx.send(Err(status)).await;
                        return;
                    }
                };
                if !selector.matches(&e) || !caller.sees(&e.atespace) {
                    continue;
                }
                let change = match services.actor_now(&e).await {
                    Ok(change) => change,
                    Err(status) => {
                        let _ = tx.send(Err(status)).await;
                        return;
                    }
                };
                if tx.send(Ok(change)).await.is_err() {
                    return;
                }
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }

    /// Every selected actor as it is now, as `initial` changes. Err: the client went away or
    /// the store failed (the error was sent).
    async fn send_actors_now(
        &self,
        selector: &Selector,
        caller: &Caller,
        tx: &mpsc::Sender<Result<v1::ActorChange, Status>>,
    ) -> Result<(), ()> {
        let mut after: Option<ActorRef> = None;
        loop {
            let listed = self
                .api
                .store
                .list_actors(selector.atespace.as_deref(), after.as_ref(), 500)
                .await;
            let page = match listed {
                Ok(page) => page,
                Err(e) => {
                    let _ = tx.send(Err(store_status(e))).await;
                    return Err(());
                }
            };
            let workers = self.api.fleet.workers().await.unwrap_or_default();
            for a in page.iter().filter(|a| caller.sees(&a.atespace)) {
                let worker = a
                    .worker_id
                    .as_ref()
                    .and_then(|id| workers.iter().find(|w| &w.id == id));
                let change = v1::ActorChange {
                    actor: Some(convert::actor(a, worker)),
                    initial: true,
                    ..v1::ActorChange::default()
                };
                if tx.send(Ok(change)).await.is_err() {
                    return Err(());
                }
            }
            match page.last() {
                Some(last) if page.len() == 500 => after = Some(last.actor_ref()),
                _ => return Ok(()),
            }
        }
    }

    /// The actor an event is about, as it is now (a later change may already show), or
    /// `deleted`.
    async fn actor_now(&self, e: &ActorEvent) -> Result<v1::ActorChange, Status> {
        let r = ActorRef::new(e.atespace.clone(), e.name.clone());
        let event = Some(convert::event(e));
        match self.api.store.get_actor(&r).await {
            Ok(a) => {
                let workers = self.api.fleet.workers().await.unwrap_or_default();
                let worker = a
                    .worker_id
                    .as_ref()
                    .and_then(|id| workers.iter().find(|w| &w.id == id));
                Ok(v1::ActorChange {
                    actor: Some(convert::actor(&a, worker)),
                    event,
                    ..v1::ActorChange::default()
                })
            }
            Err(StoreError::NotFound(_)) => Ok(v1::ActorChange {
                actor: Some(v1::Actor {
                    atespace: r.atespace,
                    name: r.name,
                    uid: e.uid.clone(),
                    ..v1::Actor::default()
                }),
                event,
                deleted: true,
                ..v1::ActorChange::default()
            }),
            Err(e) => Err(store_status(e)),
        }
    }
}

/// The feed's next event; `None` when the client went away; an error when the watcher fell
/// behind (it must list again).
async fn next<T>(
    feed: &mut broadcast::Receiver<Arc<ActorEvent>>,
    tx: &mpsc::Sender<Result<T, Status>>,
) -> Option<Result<Arc<ActorEvent>, Status>> {
    tokio::select! {
        _ = tx.closed() => None,
        got = feed.recv() => match got {
            Ok(e) => Some(Ok(e)),
            Err(broadcast::error::RecvError::Lagged(_)) => Some(Err(Status::aborted(FELL_BEHIND))),
            Err(broadcast::error::RecvError::Closed) => {
                Some(Err(Status::unavailable("the api is shutting down")))
            }
        },
    }
}
