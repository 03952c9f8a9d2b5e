//! The router's response body: the actor's streamed body, or a small text the router wrote.
//! An enum rather than a boxed body so that the data path does not allocate per response.
//! A body that arrives over a shared (pooled) HTTP/2 tunnel connection carries the connection's
//! [`InUse`] mark until it ends or is dropped, so the pool never reaps a connection mid-stream.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use hyper::body::{Body, Frame, Incoming, SizeHint};

use crate::tunnel::InUse;

#[derive(Debug)]
pub enum RouterBody {
    Stream(Incoming),
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

impl From<Incoming> for RouterBody {
    fn from(body: Incoming) -> Self {
        RouterBody::Stream(body)
    }
}

impl Body for RouterBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        match self.get_mut() {
            RouterBody::Stream(body) => Pin::new(body).poll_frame(cx),
            RouterBody::Shared(body, in_use) => {
                let frame = Pin::new(body).poll_frame(cx);
                if let Poll::Ready(Some(Err(_))) = &frame {
                    // A broken stream may mean a broken connection: do not reuse it.
                    in_use.mark_broken();
                }
                frame
            }
            RouterBody::Text(text) => Poll::Ready(text.take().map(|b| Ok(Frame::data(b)))),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            RouterBody::Stream(body) | RouterBody::Shared(body, _) => body.is_end_stream(),
            RouterBody::Text(text) => text.is_none(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            RouterBody::Stream(body) | RouterBody::Shared(body, _) => body.size_hint(),
            RouterBody::Text(text) => {
                SizeHint::with_exact(text.as_ref().map_or(0, |b| b.len() as u64))
            }
        }
    }
}
