// Decoding of binary arrays sent by nbdebug/widgets/_transport.py.
// A `bytes`/memoryview trait arrives as a DataView (JupyterLab, Notebook 7, HTML export) that may
// sit at any byteOffset inside a larger buffer: typed arrays are built from (buffer, byteOffset,
// length) and copied only when the offset is not aligned to the element size.

export type DType = "float32" | "uint8" | "int8" | "uint16" | "int16" | "uint32" | "int32";

export type TypedArray =
  | Float32Array
  | Uint8Array
  | Int8Array
  | Uint16Array
  | Int16Array
  | Uint32Array
  | Int32Array;

export interface NdArray<T extends TypedArray = TypedArray> {
  data: T;
  shape: number[];
  dtype: DType;
}

/** What a serialized array looks like in synced state: {view, dtype, shape}. */
export interface WireArray {
  view: DataView | ArrayBuffer | ArrayBufferView;
  dtype: DType;
  shape: number[];
}

const CTORS = {
  float32: Float32Array,
  uint8: Uint8Array,
  int8: Int8Array,
  uint16: Uint16Array,
  int16: Int16Array,
  uint32: Uint32Array,
  int32: Int32Array,
} as const;

export function toBytes(view: DataView | ArrayBuffer | ArrayBufferView): {
  buffer: ArrayBufferLike;
  byteOffset: number;
  byteLength: number;
} {
  if (view instanceof ArrayBuffer) return { buffer: view, byteOffset: 0, byteLength: view.byteLength };
  return { buffer: view.buffer, byteOffset: view.byteOffset, byteLength: view.byteLength };
}

/** Typed array of `dtype` over the bytes of `view`, honouring byteOffset/byteLength. */
export function typedArray(view: DataView | ArrayBuffer | ArrayBufferView, dtype: DType): TypedArray {
  const Ctor = CTORS[dtype];
  if (!Ctor) throw new Error(`nbdebug: unsupported dtype ${dtype}`);
  const { buffer, byteOffset, byteLength } = toBytes(view);
  const size = Ctor.BYTES_PER_ELEMENT;
  if (byteLength % size !== 0) throw new Error(`nbdebug: ${byteLength} bytes is not a whole number of ${dtype}`);
  const n = byteLength / size;
  if (byteOffset % size === 0) return new Ctor(buffer as ArrayBuffer, byteOffset, n);
  // Unaligned: copy the bytes into a fresh buffer first.
  const copy = new Uint8Array(byteLength);
  copy.set(new Uint8Array(buffer as ArrayBuffer, byteOffset, byteLength));
  return new Ctor(copy.buffer, 0, n);
}

/** Decode a {view, dtype, shape} wire array; checks that the shape matches the byte count. */
export function decode(wire: WireArray): NdArray {
  const data = typedArray(wire.view, wire.dtype);
  const expected = wire.shape.reduce((a, b) => a * b, 1);
  if (data.length !== expected) {
    throw new Error(`nbdebug: array of shape [${wire.shape}] needs ${expected} values, got ${data.length}`);
  }
  return { data, shape: wire.shape.slice(), dtype: wire.dtype };
}

/** Row-major index helper: offset of `idx` in an array of `shape`. */
export function offset(shape: number[], idx: number[]): number {
  let o = 0;
  for (let i = 0; i < shape.length; i++) o = o * shape[i] + idx[i];
  return o;
}
