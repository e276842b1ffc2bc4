//! The codec of the generated servers: tonic-prost's, except for requests that cannot be
//! decoded (garbage bytes, a string field that is not UTF-8, another protocol's message).
//! tonic-prost reports those as INTERNAL, which says "the server is broken"; they are the
//! caller's fault, so the servers answer INVALID_ARGUMENT with what to check. Clients keep
//! tonic-prost's codec: a response they cannot decode is not the server's caller's fault.

use tonic::codec::{BufferSettings, Codec, DecodeBuf, Decoder};
use tonic::Status;
use tonic_prost::{ProstCodec, ProstDecoder, ProstEncoder};

/// [`ProstCodec`] whose decoder answers INVALID_ARGUMENT for an undecodable request.
#[derive(Debug, Default)]
pub struct RequestCodec<T, U>(ProstCodec<T, U>);

impl<T, U> Codec for RequestCodec<T, U>
where
    T: prost::Message + Send + 'static,
    U: prost::Message + Default + Send + 'static,
{
    type Encode = T;
    type Decode = U;
    type Encoder = ProstEncoder<T>;
    type Decoder = RequestDecoder<U>;

    fn encoder(&mut self) -> Self::Encoder {
        self.0.encoder()
    }

    fn decoder(&mut self) -> Self::Decoder {
        RequestDecoder(self.0.decoder())
    }
}

/// [`ProstDecoder`] with the status of a request that cannot be decoded changed to
/// INVALID_ARGUMENT.
#[derive(Debug)]
pub struct RequestDecoder<U>(ProstDecoder<U>);

impl<U: prost::Message + Default> Decoder for RequestDecoder<U> {
    type Item = U;
    type Error = Status;

    fn decode(&mut self, buf: &mut DecodeBuf<'_>) -> Result<Option<U>, Status> {
        self.0.decode(buf).map_err(|status| {
            Status::invalid_argument(format!(
                "the request could not be decoded ({}): send a txoutbox.v1 message generated \
                 from the server's .proto files, with UTF-8 strings",
                status.message()
            ))
        })
    }

    fn buffer_settings(&self) -> BufferSettings {
        self.0.buffer_settings()
    }
}
