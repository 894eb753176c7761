"""``tf.train.Example`` message classes without importing TensorFlow.

Chunks and shards are TFRecord files of ``tf.train.Example`` protos.  The
self-play workers, the Beam job and the inspect tools must read and write
them without paying TensorFlow's import (seconds) or requiring it on Beam
workers, so this module declares the same five messages (field numbers and
types copied from ``tensorflow/core/example/{example,feature}.proto``) in a
private descriptor pool.  The wire bytes are identical to TensorFlow's; a
test parses our bytes with ``tf.io.parse_example`` to prove it.

`varint` is the wire format's integer, for the writers that emit protobuf
wire bytes directly (format.group_wire).

A private pool (not the default one) keeps this from clashing with
TensorFlow's own registration of ``tensorflow.Example`` when both are loaded
in one process.
"""

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

_F = descriptor_pb2.FieldDescriptorProto


def _file_descriptor() -> descriptor_pb2.FileDescriptorProto:
    fd = descriptor_pb2.FileDescriptorProto(name="zerolake/example.proto", package="tensorflow", syntax="proto3")

    def message(name):
        return fd.message_type.add(name=name)

    def field(msg, name, number, ftype, label=_F.LABEL_OPTIONAL, type_name=None, packed=None, oneof=None):
        f = msg.field.add(name=name, number=number, type=ftype, label=label)
        if type_name:
            f.type_name = type_name
        if packed is not None:
            f.options.packed = packed
        if oneof is not None:
            f.oneof_index = oneof
        return f

    field(message("BytesList"), "value", 1, _F.TYPE_BYTES, _F.LABEL_REPEATED)
    field(message("FloatList"), "value", 1, _F.TYPE_FLOAT, _F.LABEL_REPEATED, packed=True)
    field(message("Int64List"), "value", 1, _F.TYPE_INT64, _F.LABEL_REPEATED, packed=True)

    feature = message("Feature")
    feature.oneof_decl.add(name="kind")
    field(feature, "bytes_list", 1, _F.TYPE_MESSAGE, type_name=".tensorflow.BytesList", oneof=0)
    field(feature, "float_list", 2, _F.TYPE_MESSAGE, type_name=".tensorflow.FloatList", oneof=0)
    field(feature, "int64_list", 3, _F.TYPE_MESSAGE, type_name=".tensorflow.Int64List", oneof=0)

    features = message("Features")
    entry = features.nested_type.add(name="FeatureEntry")
    entry.options.map_entry = True
    field(entry, "key", 1, _F.TYPE_STRING)
    field(entry, "value", 2, _F.TYPE_MESSAGE, type_name=".tensorflow.Feature")
    field(features, "feature", 1, _F.TYPE_MESSAGE, _F.LABEL_REPEATED, type_name=".tensorflow.Features.FeatureEntry")

    example = message("Example")
    field(example, "features", 1, _F.TYPE_MESSAGE, type_name=".tensorflow.Features")
    return fd


_POOL = descriptor_pool.DescriptorPool()
_POOL.Add(_file_descriptor())

Example = message_factory.GetMessageClass(_POOL.FindMessageTypeByName("tensorflow.Example"))
Feature = message_factory.GetMessageClass(_POOL.FindMessageTypeByName("tensorflow.Feature"))


def varint(value: int) -> bytes:
    """One int64 as a protobuf varint (negatives as 10-byte two's complement, as protobuf writes them)."""
    value &= 0xFFFFFFFFFFFFFFFF  # int64 negatives are 10-byte two's complement
    out = bytearray()
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)
