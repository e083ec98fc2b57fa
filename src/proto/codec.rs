//! The gRPC codec of every service (`build.rs` names it): protobuf as prost
//! writes and reads it, with the bytes moved in one piece. prost writes a
//! message a byte or a field at a time, and reads it so too; into and out of
//! the transport's buffer each of those small steps is a call of its own,
//! while into a plain vector, or out of a plain slice, it is a store or a
//! load. The bytes on the wire are the same.

use std::marker::PhantomData;

use prost::bytes::{Buf, BufMut};
use prost::Message;
use tonic::codec::{DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::Status;

/// Messages up to this size are written into the encoder's own vector
/// first; a larger one (a job file, a long listing) straight into the
/// transport's buffer, so that no stream keeps a large vector for its life.
const SCRATCH_MOST: usize = 64 * 1024;

/// The codec: messages of type `T` out, `U` in.
#[derive(Debug, Clone)]
pub struct Prost<T, U>(PhantomData<(T, U)>);

impl<T, U> Default for Prost<T, U> {
    fn default() -> Self {
        Prost(PhantomData)
    }
}

impl<T, U> tonic::codec::Codec for Prost<T, U>
where
    T: Message + Send + 'static,
    U: Message + Default + Send + 'static,
{
    type Encode = T;
    type Decode = U;
    type Encoder = Encode<T>;
    type Decoder = Decode<U>;

    fn encoder(&mut self) -> Encode<T> {
        Encode { scratch: Vec::new(), of: PhantomData }
    }

    fn decoder(&mut self) -> Decode<U> {
        Decode(PhantomData)
    }
}

/// Writes each message into `scratch`, then into the transport's buffer at once.
#[derive(Debug)]
pub struct Encode<T> {
    scratch: Vec<u8>,
    of: PhantomData<T>,
}

impl<T: Message> Encoder for Encode<T> {
    type Item = T;
    type Error = Status;

    fn encode(&mut self, item: T, buf: &mut EncodeBuf<'_>) -> Result<(), Status> {
        let len = item.encoded_len();
        if len > SCRATCH_MOST {
            buf.reserve(len);
            item.encode_raw(buf);
            return Ok(());
        }
        self.scratch.clear();
        item.encode_raw(&mut self.scratch);
        buf.put_slice(&self.scratch);
        Ok(())
    }
}

/// Reads each message from the one slice the transport's buffer holds it in.
#[derive(Debug)]
pub struct Decode<U>(PhantomData<U>);

impl<U: Message + Default> Decoder for Decode<U> {
    type Item = U;
    type Error = Status;

    fn decode(&mut self, buf: &mut DecodeBuf<'_>) -> Result<Option<U>, Status> {
        let len = buf.remaining();
        let decoded = if buf.chunk().len() == len {
            let decoded = U::decode(buf.chunk());
            buf.advance(len);
            decoded
        } else {
            U::decode(buf.copy_to_bytes(len))
        };
        // An unreadable message is an internal error, as gRPC's status codes say.
        decoded.map(Some).map_err(|e| Status::internal(e.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::plugin::{admin_to_worker_message, AdminToWorkerMessage, ExecuteJobRequest, JobSpec};
    use http_body_util::BodyExt;
    use tonic::codec::{Codec, EncodeBody, Streaming};

    fn order(parameters: usize) -> AdminToWorkerMessage {
        let spec = JobSpec {
            job_id: "a.1.1".into(),
            job_type: "noop".into(),
            parameters: (0..parameters).map(|n| (format!("p{n}"), Default::default())).collect(),
            ..Default::default()
        };
        let request = ExecuteJobRequest { job: Some(spec), ..Default::default() };
        AdminToWorkerMessage {
            request_id: "r".into(),
            body: Some(admin_to_worker_message::Body::ExecuteJobRequest(request)),
            ..Default::default()
        }
    }

    #[tokio::test]
    async fn messages_go_out_as_prost_writes_them_and_come_back_whole_small_or_large() {
        let messages: Vec<AdminToWorkerMessage> = [0, 3, 10_000].into_iter().map(order).collect();
        assert!(messages[2].encoded_len() > SCRATCH_MOST, "the large one takes the direct way");
        let mut codec = Prost::<AdminToWorkerMessage, AdminToWorkerMessage>::default();
        let source = tokio_stream::iter(messages.clone().into_iter().map(Ok));
        let body = EncodeBody::new_client(codec.encoder(), source, None, None);
        let sent = body.collect().await.expect("encoded").to_bytes();
        // Each message framed as gRPC frames it: a flag byte, its length, prost's bytes.
        let mut expected = Vec::new();
        for message in &messages {
            let bytes = message.encode_to_vec();
            expected.push(0u8);
            expected.extend_from_slice(&u32::try_from(bytes.len()).unwrap().to_be_bytes());
            expected.extend_from_slice(&bytes);
        }
        assert_eq!(&sent[..], &expected[..]);
        let mut received =
            Streaming::new_request(codec.decoder(), http_body_util::Full::new(sent), None, Some(usize::MAX));
        for message in &messages {
            assert_eq!(received.message().await.expect("decoded").as_ref(), Some(message));
        }
        assert_eq!(received.message().await.expect("the end"), None);
    }

    #[tokio::test]
    async fn bytes_that_are_no_message_are_an_internal_error() {
        let mut codec = Prost::<AdminToWorkerMessage, AdminToWorkerMessage>::default();
        let frame = prost::bytes::Bytes::from_static(&[0, 0, 0, 0, 2, 0x0a, 0x05]);
        let mut received = Streaming::new_request(codec.decoder(), http_body_util::Full::new(frame), None, None);
        let refused = received.message().await.expect_err("a field longer than the message");
        assert_eq!(refused.code(), tonic::Code::Internal);
    }
}
