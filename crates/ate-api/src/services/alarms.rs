//! AlarmService: actors' alarms. Workers set, read and delete the alarm of an actor running on
//! them (the local actor API); the delivery itself is `workflows::alarms`.

use ate_core::clock::now_ms;
use ate_proto::v1::alarm_service_server::AlarmService;
use ate_proto::v1::{
    Alarm, DeleteAlarmRequest, DeleteAlarmResponse, GetAlarmRequest, GetAlarmResponse,
    ListAlarmsRequest, ListAlarmsResponse, SetAlarmRequest,
};
use tonic::{Request, Response, Status};

use super::{Services, actor_ref, ref_atespace};
use crate::authz::Need;
use crate::convert::{self, store_status};

/// The longest an alarm may be set ahead: a year (a due time further out is almost surely a
/// unit mistake, seconds for milliseconds or the reverse).
const MAX_AHEAD_MS: i64 = 366 * 24 * 3600 * 1000;
/// The longest alarm path.
const MAX_PATH: usize = 1024;

/// An alarm path or InvalidArgument naming the field: an origin-form path (and query) with no
/// spaces or control characters.
pub(crate) fn check_path(path: &str) -> Result<(), Status> {
    let bad = |why: &str| Status::invalid_argument(format!("invalid path {path:?}: {why}"));
    if !path.starts_with('/') {
        return Err(bad("must start with '/'"));
    }
    if path.len() > MAX_PATH {
        return Err(bad(&format!("longer than {MAX_PATH} bytes")));
    }
    if path.bytes().any(|b| b.is_ascii_control() || b == b' ') {
        return Err(bad("contains spaces or control characters"));
    }
    http::uri::PathAndQuery::try_from(path).map_err(|e| bad(&e.to_string()))?;
    Ok(())
}

#[tonic::async_trait]
impl AlarmService for Services {
    async fn set_alarm(&self, req: Request<SetAlarmRequest>) -> Result<Response<Alarm>, Status> {
        const RPC: &str = "AlarmService/SetAlarm";
        let caller = self.authorize(&req, RPC, |r| Need::Alarm(ref_atespace(&r.actor)))?;
        let req = req.into_inner();
        let r = actor_ref(req.actor)?;
        check_path(&req.path)?;
        let now = now_ms();
        if req.due_unix_ms <= 0 || req.due_unix_ms > now.saturating_add(MAX_AHEAD_MS) {
            return Err(Status::invalid_argument(format!(
                "invalid due_unix_ms {}: must be a Unix time in milliseconds at most a year ahead",
                req.due_unix_ms
            )));
        }
        self.check_worker_actor(&caller, RPC, &r, req.activation)
            .await?;
        // Due in the past: due now (it fires at once).
        let alarm = self
            .api
            .store
            .set_alarm(&r, req.due_unix_ms, &req.path, now)
            .await
            .map_err(store_status)?;
        self.api.alarms_changed();
        tracing::info!(actor = %r, due_unix_ms = alarm.due_ms, path = %alarm.path, "alarm set");
        Ok(Response::new(convert::alarm(&alarm)))
    }

    async fn get_alarm(
        &self,
        req: Request<GetAlarmRequest>,
    ) -> Result<Response<GetAlarmResponse>, Status> {
        const RPC: &str = "AlarmService/GetAlarm";
        let caller = self.authorize(&req, RPC, |r| Need::Alarm(ref_atespace(&r.actor)))?;
        let req = req.into_inner();
        let r = actor_ref(req.actor)?;
        self.check_worker_actor(&caller, RPC, &r, req.activation)
            .await?;
        let alarm = self.api.store.get_alarm(&r).await.map_err(store_status)?;
        Ok(Response::new(GetAlarmResponse {
            alarm: alarm.as_ref().map(convert::alarm),
        }))
    }

    async fn delete_alarm(
        &self,
        req: Request<DeleteAlarmRequest>,
    ) -> Result<Response<DeleteAlarmResponse>, Status> {
        const RPC: &str = "AlarmService/DeleteAlarm";
        let caller = self.authorize(&req, RPC, |r| Need::Alarm(ref_atespace(&r.actor)))?;
        let req = req.into_inner();
        let r = actor_ref(req.actor)?;
        self.check_worker_actor(&caller, RPC, &r, req.activation)
            .await?;
        let deleted = self
            .api
            .store
            .delete_alarm(&r, None)
            .await
            .map_err(store_status)?;
        if deleted {
            tracing::info!(actor = %r, "alarm deleted");
        }
        Ok(Response::new(DeleteAlarmResponse { deleted }))
    }

    async fn list_alarms(
        &self,
        req: Request<ListAlarmsRequest>,
    ) -> Result<Response<ListAlarmsResponse>, Status> {
        const RPC: &str = "AlarmService/ListAlarms";
        let caller = self.authorize(&req, RPC, |r| Need::atespace_or_list(&r.atespace))?;
        let req = req.into_inner();
        let atespace = (!req.atespace.is_empty()).then_some(req.atespace.as_str());
        let alarms = self
            .api
            .store
            .list_alarms(atespace)
            .await
            .map_err(store_status)?;
        Ok(Response::new(ListAlarmsResponse {
            alarms: alarms
                .iter()
                .filter(|a| caller.sees(&a.actor.atespace))
                .map(convert::alarm)
                .collect(),
        }))
    }
}
