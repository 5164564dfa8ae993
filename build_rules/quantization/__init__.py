"""What a quantized variant is, whichever quantizer makes it: the quantized types (dtypes), the precision record
(quant_spec), LPBQ's int4 blocks (block_quant), AIMET's techniques (aimet_techniques), one encoding per state
pair of a step graph (state_encodings), an element-wise op's constants at its op's type
(elementwise_constants).

May import: errors, plumbing.
"""
