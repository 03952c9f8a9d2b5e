//! Multipart uploads that are always finished or aborted, never left incomplete in the bucket.

use std::sync::Arc;

use bytes::Bytes;
use object_store::path::Path as ObjPath;
use object_store::{ObjectStore, ObjectStoreExt, WriteMultipart};

use super::PART_SIZE;
use crate::error::{Error, Result};

/// A multipart upload that is aborted unless it is finished: S3 keeps the parts of an upload
/// that is neither completed nor aborted (billed, and invisible to `list`) until a bucket
/// lifecycle rule removes them. Dropping the guard (an early return, a cancelled upload) aborts
/// it in a task of its own.
pub(super) struct MultipartGuard {
    writer: Option<WriteMultipart>,
    obj: ObjPath,
}

impl MultipartGuard {
    /// Creates the multipart upload in a task of its own. Cancelled while S3 creates it, a
    /// plain call would drop the upload's id with its response and leave it incomplete; here
    /// the guard is built in the task, and one nobody receives any more aborts on drop.
    pub(super) async fn start(store: Arc<dyn ObjectStore>, obj: ObjPath) -> Result<Self> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let target = obj.clone();
        tokio::spawn(async move {
            let started = store.put_multipart(&target).await.map(|up| Self {
                writer: Some(WriteMultipart::new_with_chunk_size(up, PART_SIZE)),
                obj: target.clone(),
            });
            // A send that fails hands the guard back here, and dropping it aborts the upload.
            let _ = tx.send(started);
        });
        match rx.await {
            Ok(started) => started.map_err(|e| Error::object(&obj, e)),
            Err(_) => Err(Error::Task {
                what: format!("start a multipart upload of {obj}"),
                message: "the task ended without a result".into(),
            }),
        }
    }

    pub(super) fn put(&mut self, chunk: Bytes) {
        if let Some(w) = self.writer.as_mut() {
            w.put(chunk);
        }
    }

    pub(super) async fn wait_for_capacity(&mut self, parts: usize) -> object_store::Result<()> {
        match self.writer.as_mut() {
            Some(w) => w.wait_for_capacity(parts).await,
            None => Ok(()),
        }
    }

    /// Aborts and waits for it; a failure is logged (the lifecycle rule is the fallback).
    pub(super) async fn abort(mut self) {
        if let Some(w) = self.writer.take() {
            // Spawned: a caller dropped while waiting does not cut the abort short.
            let _ = tokio::spawn(abort_multipart(w, self.obj.clone())).await;
        }
    }

    /// Uploads the last part and completes the upload (`WriteMultipart::finish` aborts it
    /// itself when a part or the completion fails). Spawned, so a caller dropped half-way
    /// leaves neither an incomplete upload nor one cut off between its parts.
    pub(super) async fn finish(mut self) -> Result<()> {
        let Some(w) = self.writer.take() else {
            return Ok(());
        };
        match tokio::spawn(w.finish()).await {
            Ok(done) => done.map(|_| ()).map_err(|e| Error::object(&self.obj, e)),
            Err(e) => Err(Error::task(format!("complete {}", self.obj), e)),
        }
    }
}

impl Drop for MultipartGuard {
    fn drop(&mut self) {
        let Some(w) = self.writer.take() else {
            return;
        };
        match tokio::runtime::Handle::try_current() {
            Ok(rt) => {
                rt.spawn(abort_multipart(w, self.obj.clone()));
            }
            Err(_) => {
                tracing::warn!(object = %self.obj, "multipart upload left incomplete: no runtime to abort it on");
            }
        }
    }
}

async fn abort_multipart(w: WriteMultipart, obj: ObjPath) {
    if let Err(e) = w.abort().await {
        tracing::warn!(object = %obj, error = %e, "cannot abort a multipart upload; the bucket's AbortIncompleteMultipartUpload rule has to remove it");
    }
}
