//! The router's response body: the actor's streamed body, or a small text the router wrote.
//! An enum rather than a boxed body so that the data path does not allocate per response.
//! A body that arrives over a shared (pooled) HTTP/2 tunnel connection carries the connection's
//! [`InUse`] mark until it ends or is dropped, so the pool never reaps a connection mid-stream.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use hyper::body::{Body, Frame, Incoming, SizeHint};

use crate::tunnel::{InUse, PoolReturn};

#[derive(Debug)]
pub enum RouterBody {
    Stream(Incoming),
    /// The actor's body on a pooled HTTP/1.1 tunnel, which goes back to the pool when it ends.
    Pooled(Pooled),
    /// The actor's body on a shared tunnel connection, marked in use while it lives.
    Shared(Incoming, InUse),
    Text(Option<Bytes>),
}

impl RouterBody {
    pub fn text(text: impl Into<Bytes>) -> Self {
        let bytes = text.into();
        RouterBody::Text((!bytes.is_empty()).then_some(bytes))
    }

    pub fn empty() -> Self {
        RouterBody::Text(None)
    }
}

/// A body whose end returns its connection to the pool: when `poll_frame` sees the end, or when
/// it is dropped after its end (a server that saw `is_end_stream` need not poll again). Dropped
/// before its end, the connection is not reusable and goes with it. While it streams, polling it
/// also polls the connection's I/O (a handed-off tunnel has no task of its own).
#[derive(Debug)]
pub struct Pooled {
    body: Incoming,
    back: Option<PoolReturn>,
}

impl Pooled {
    fn finish(&mut self) {
        if let Some(back) = self.back.take() {
            back.done();
        }
    }
}

impl Drop for Pooled {
    fn drop(&mut self) {
        if self.body.is_end_stream() {
            self.finish();
        }
    }
}

impl RouterBody {
    /// `body` from a pooled connection, `back` returning it.
    pub fn pooled(body: Incoming, back: PoolReturn) -> Self {
        RouterBody::Pooled(Pooled {
            body,
            back: Some(back),
        })
    }
}

impl From<Incoming> for RouterBody {
    fn from(body: Incoming) -> Self {
        RouterBody::Stream(body)
    }
}

/// The error of a [`RouterBody`]: hyper's, or [`CutBody`]. Boxed only when a body fails.
pub type BodyError = Box<dyn std::error::Error + Send + Sync>;

/// A body delimited by the end of its connection (no Content-Length, not chunked) whose
/// connection was cut by atunnel or the router (ingress off, the worker gone), not closed by the
/// actor: the end it read may not be the body's end, so the client gets an error (HTTP/1.1: the
/// connection closed before the last chunk; h2: RST_STREAM), never a clean but short body.
#[derive(Debug, thiserror::Error)]
#[error("the actor's connection was cut before the end of a body delimited by its close")]
pub struct CutBody;

impl Body for RouterBody {
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        match self.get_mut() {
            RouterBody::Stream(body) => Pin::new(body).poll_frame(cx).map_err(Into::into),
            RouterBody::Shared(body, in_use) => {
                let frame = Pin::new(body).poll_frame(cx);
                if let Poll::Ready(Some(Err(_))) = &frame {
                    // A broken stream may mean a broken connection: do not reuse it.
                    in_use.mark_broken();
                }
                frame.map_err(Into::into)
            }
            RouterBody::Pooled(pooled) => {
                let mut frame = Pin::new(&mut pooled.body).poll_frame(cx);
                if frame.is_pending()
                    && let Some(back) = &mut pooled.back
                    && back.poll_io(cx)
                {
                    // The connection may just have read the next frame.
                    frame = Pin::new(&mut pooled.body).poll_frame(cx);
                }
                match &frame {
                    Poll::Ready(None)
                        if pooled.back.as_ref().is_some_and(PoolReturn::cut_before_end) =>
                    {
                        pooled.back = None;
                        return Poll::Ready(Some(Err(CutBody.into())));
                    }
                    Poll::Ready(None) => pooled.finish(),
                    Poll::Ready(Some(Ok(_))) if pooled.body.is_end_stream() => pooled.finish(),
                    // A broken body: the connection is not reused.
                    Poll::Ready(Some(Err(_))) => pooled.back = None,
                    _ => {}
                }
                frame.map_err(Into::into)
            }
            RouterBody::Text(text) => Poll::Ready(text.take().map(|b| Ok(Frame::data(b)))),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            RouterBody::Stream(body) | RouterBody::Shared(body, _) => body.is_end_stream(),
            RouterBody::Pooled(pooled) => pooled.body.is_end_stream(),
            RouterBody::Text(text) => text.is_none(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            RouterBody::Stream(body) | RouterBody::Shared(body, _) => body.size_hint(),
            RouterBody::Pooled(pooled) => pooled.body.size_hint(),
            RouterBody::Text(text) => {
                SizeHint::with_exact(text.as_ref().map_or(0, |b| b.len() as u64))
            }
        }
    }
}
