//! The router's response body: the actor's streamed body, or a small text the router wrote.
//! An enum rather than a boxed body so that the data path does not allocate per response.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use hyper::body::{Body, Frame, Incoming, SizeHint};

#[derive(Debug)]
pub enum RouterBody {
    Stream(Incoming),
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
            RouterBody::Text(text) => Poll::Ready(text.take().map(|b| Ok(Frame::data(b)))),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            RouterBody::Stream(body) => body.is_end_stream(),
            RouterBody::Text(text) => text.is_none(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            RouterBody::Stream(body) => body.size_hint(),
            RouterBody::Text(text) => {
                SizeHint::with_exact(text.as_ref().map_or(0, |b| b.len() as u64))
            }
        }
    }
}
