/* fuzz_blobs.c - stand-ins for the guest blobs (CPL0 stubs, vDSO) that zeroboot_kernel/_build_native.py
 * generates for the extension: the harnesses never run a guest, so one-byte images are enough. */
const unsigned char zb_cpl0_stubs[] = {0xf4}; /* hlt */
const unsigned long zb_cpl0_stubs_len = sizeof zb_cpl0_stubs;
const unsigned char zb_vdso_image[] = {0};
const unsigned long zb_vdso_image_len = sizeof zb_vdso_image;
