/*
 * papiStdEventDefs.h: PAPI 7.0's preset event codes, served by papirus.
 *
 * A preset's code is PAPI_PRESET_MASK | its index; a native event's is
 * PAPI_NATIVE_MASK | an index papirus hands out the first time a name is
 * looked up in the process. papirus defines each preset per CPU in
 * lowlevel/data/presets.csv (list: lowlevel/data/preset_list.csv); a preset
 * with no working definition here is reported unavailable, with the reason,
 * by PAPI_get_event_info() (count 0) and fails to add with PAPI_ENOEVNT.
 */
#ifndef _PAPISTDEVENTDEFS
#define _PAPISTDEVENTDEFS

#define PAPI_PRESET_MASK     ((int)0x80000000)
#define PAPI_NATIVE_MASK     ((int)0x40000000)
#define PAPI_UE_MASK         ((int)0xC0000000)
#define PAPI_PRESET_AND_MASK 0x7FFFFFFF
#define PAPI_NATIVE_AND_MASK 0xBFFFFFFF
#define PAPI_UE_AND_MASK     0x3FFFFFFF

#define PAPI_MAX_PRESET_EVENTS 128
#define PAPI_MAX_USER_EVENTS 50
#define USER_EVENT_OPERATION_LEN 512

#define IS_NATIVE(EventCode) ( ( EventCode & PAPI_NATIVE_MASK ) && !(EventCode & PAPI_PRESET_MASK) )
#define IS_PRESET(EventCode) ( ( EventCode & PAPI_PRESET_MASK ) && !(EventCode & PAPI_NATIVE_MASK) )
#define IS_USER_DEFINED(EventCode) ( ( EventCode & PAPI_PRESET_MASK ) && (EventCode & PAPI_NATIVE_MASK) )

/* Indices, in PAPI 7.0's order. */
enum
{
   PAPI_L1_DCM_idx = 0,   /* L1D cache misses */
   PAPI_L1_ICM_idx,   /* L1I cache misses */
   PAPI_L2_DCM_idx,   /* L2D cache misses */
   PAPI_L2_ICM_idx,   /* L2I cache misses */
   PAPI_L3_DCM_idx,   /* L3D cache misses */
   PAPI_L3_ICM_idx,   /* L3I cache misses */
   PAPI_L1_TCM_idx,   /* L1 cache misses */
   PAPI_L2_TCM_idx,   /* L2 cache misses */
   PAPI_L3_TCM_idx,   /* L3 cache misses */
   PAPI_CA_SNP_idx,   /* Snoop Requests */
   PAPI_CA_SHR_idx,   /* Ex Acces shared CL */
   PAPI_CA_CLN_idx,   /* Ex Access clean CL */
   PAPI_CA_INV_idx,   /* Cache ln invalid */
   PAPI_CA_ITV_idx,   /* Cache ln intervene */
   PAPI_L3_LDM_idx,   /* L3 load misses */
   PAPI_L3_STM_idx,   /* L3 store misses */
   PAPI_BRU_IDL_idx,  /* Branch idle cycles */
   PAPI_FXU_IDL_idx,  /* IU idle cycles */
   PAPI_FPU_IDL_idx,  /* FPU idle cycles */
   PAPI_LSU_IDL_idx,  /* L/SU idle cycles */
   PAPI_TLB_DM_idx,   /* Data TLB misses */
   PAPI_TLB_IM_idx,   /* Instr TLB misses */
   PAPI_TLB_TL_idx,   /* Total TLB misses */
   PAPI_L1_LDM_idx,   /* L1 load misses */
   PAPI_L1_STM_idx,   /* L1 store misses */
   PAPI_L2_LDM_idx,   /* L2 load misses */
   PAPI_L2_STM_idx,   /* L2 store misses */
   PAPI_BTAC_M_idx,   /* Br targt addr miss */
   PAPI_PRF_DM_idx,   /* Data prefetch miss */
   PAPI_L3_DCH_idx,   /* L3D cache hits */
   PAPI_TLB_SD_idx,   /* TLB shootdowns */
   PAPI_CSR_FAL_idx,  /* Failed store cond */
   PAPI_CSR_SUC_idx,  /* Good store cond */
   PAPI_CSR_TOT_idx,  /* Total store cond */
   PAPI_MEM_SCY_idx,  /* Stalled mem cycles */
   PAPI_MEM_RCY_idx,  /* Stalled rd cycles */
   PAPI_MEM_WCY_idx,  /* Stalled wr cycles */
   PAPI_STL_ICY_idx,  /* No instr issue */
   PAPI_FUL_ICY_idx,  /* Max instr issue */
   PAPI_STL_CCY_idx,  /* No instr done */
   PAPI_FUL_CCY_idx,  /* Max instr done */
   PAPI_HW_INT_idx,   /* Hdw interrupts */
   PAPI_BR_UCN_idx,   /* Uncond branch */
   PAPI_BR_CN_idx,    /* Cond branch */
   PAPI_BR_TKN_idx,   /* Cond branch taken */
   PAPI_BR_NTK_idx,   /* Cond br not taken */
   PAPI_BR_MSP_idx,   /* Cond br mspredictd */
   PAPI_BR_PRC_idx,   /* Cond br predicted */
   PAPI_FMA_INS_idx,  /* FMAs completed */
   PAPI_TOT_IIS_idx,  /* Instr issued */
   PAPI_TOT_INS_idx,  /* Instr completed */
   PAPI_INT_INS_idx,  /* Int instructions */
   PAPI_FP_INS_idx,   /* FP instructions */
   PAPI_LD_INS_idx,   /* Loads */
   PAPI_SR_INS_idx,   /* Stores */
   PAPI_BR_INS_idx,   /* Branches */
   PAPI_VEC_INS_idx,  /* Vector/SIMD instr */
   PAPI_RES_STL_idx,  /* Stalled res cycles */
   PAPI_FP_STAL_idx,  /* Stalled FPU cycles */
   PAPI_TOT_CYC_idx,  /* Total cycles */
   PAPI_LST_INS_idx,  /* L/S completed */
   PAPI_SYC_INS_idx,  /* Syncs completed */
   PAPI_L1_DCH_idx,   /* L1D cache hits */
   PAPI_L2_DCH_idx,   /* L2D cache hits */
   PAPI_L1_DCA_idx,   /* L1D cache accesses */
   PAPI_L2_DCA_idx,   /* L2D cache accesses */
   PAPI_L3_DCA_idx,   /* L3D cache accesses */
   PAPI_L1_DCR_idx,   /* L1D cache reads */
   PAPI_L2_DCR_idx,   /* L2D cache reads */
   PAPI_L3_DCR_idx,   /* L3D cache reads */
   PAPI_L1_DCW_idx,   /* L1D cache writes */
   PAPI_L2_DCW_idx,   /* L2D cache writes */
   PAPI_L3_DCW_idx,   /* L3D cache writes */
   PAPI_L1_ICH_idx,   /* L1I cache hits */
   PAPI_L2_ICH_idx,   /* L2I cache hits */
   PAPI_L3_ICH_idx,   /* L3I cache hits */
   PAPI_L1_ICA_idx,   /* L1I cache accesses */
   PAPI_L2_ICA_idx,   /* L2I cache accesses */
   PAPI_L3_ICA_idx,   /* L3I cache accesses */
   PAPI_L1_ICR_idx,   /* L1I cache reads */
   PAPI_L2_ICR_idx,   /* L2I cache reads */
   PAPI_L3_ICR_idx,   /* L3I cache reads */
   PAPI_L1_ICW_idx,   /* L1I cache writes */
   PAPI_L2_ICW_idx,   /* L2I cache writes */
   PAPI_L3_ICW_idx,   /* L3I cache writes */
   PAPI_L1_TCH_idx,   /* L1 cache hits */
   PAPI_L2_TCH_idx,   /* L2 cache hits */
   PAPI_L3_TCH_idx,   /* L3 cache hits */
   PAPI_L1_TCA_idx,   /* L1 cache accesses */
   PAPI_L2_TCA_idx,   /* L2 cache accesses */
   PAPI_L3_TCA_idx,   /* L3 cache accesses */
   PAPI_L1_TCR_idx,   /* L1 cache reads */
   PAPI_L2_TCR_idx,   /* L2 cache reads */
   PAPI_L3_TCR_idx,   /* L3 cache reads */
   PAPI_L1_TCW_idx,   /* L1 cache writes */
   PAPI_L2_TCW_idx,   /* L2 cache writes */
   PAPI_L3_TCW_idx,   /* L3 cache writes */
   PAPI_FML_INS_idx,  /* FPU multiply */
   PAPI_FAD_INS_idx,  /* FPU add */
   PAPI_FDV_INS_idx,  /* FPU divide */
   PAPI_FSQ_INS_idx,  /* FPU square root */
   PAPI_FNV_INS_idx,  /* FPU inverse */
   PAPI_FP_OPS_idx,   /* FP operations */
   PAPI_SP_OPS_idx,   /* SP operations */
   PAPI_DP_OPS_idx,   /* DP operations */
   PAPI_VEC_SP_idx,   /* SP Vector/SIMD instr */
   PAPI_VEC_DP_idx,   /* DP Vector/SIMD instr */
   PAPI_REF_CYC_idx,  /* Reference Cycles */
   PAPI_END_idx              /* one past the last */
};

#define PAPI_L1_DCM  (PAPI_L1_DCM_idx  | PAPI_PRESET_MASK)
#define PAPI_L1_ICM  (PAPI_L1_ICM_idx  | PAPI_PRESET_MASK)
#define PAPI_L2_DCM  (PAPI_L2_DCM_idx  | PAPI_PRESET_MASK)
#define PAPI_L2_ICM  (PAPI_L2_ICM_idx  | PAPI_PRESET_MASK)
#define PAPI_L3_DCM  (PAPI_L3_DCM_idx  | PAPI_PRESET_MASK)
#define PAPI_L3_ICM  (PAPI_L3_ICM_idx  | PAPI_PRESET_MASK)
#define PAPI_L1_TCM  (PAPI_L1_TCM_idx  | PAPI_PRESET_MASK)
#define PAPI_L2_TCM  (PAPI_L2_TCM_idx  | PAPI_PRESET_MASK)
#define PAPI_L3_TCM  (PAPI_L3_TCM_idx  | PAPI_PRESET_MASK)
#define PAPI_CA_SNP  (PAPI_CA_SNP_idx  | PAPI_PRESET_MASK)
#define PAPI_CA_SHR  (PAPI_CA_SHR_idx  | PAPI_PRESET_MASK)
#define PAPI_CA_CLN  (PAPI_CA_CLN_idx  | PAPI_PRESET_MASK)
#define PAPI_CA_INV  (PAPI_CA_INV_idx  | PAPI_PRESET_MASK)
#define PAPI_CA_ITV  (PAPI_CA_ITV_idx  | PAPI_PRESET_MASK)
#define PAPI_L3_LDM  (PAPI_L3_LDM_idx  | PAPI_PRESET_MASK)
#define PAPI_L3_STM  (PAPI_L3_STM_idx  | PAPI_PRESET_MASK)
#define PAPI_BRU_IDL (PAPI_BRU_IDL_idx | PAPI_PRESET_MASK)
#define PAPI_FXU_IDL (PAPI_FXU_IDL_idx | PAPI_PRESET_MASK)
#define PAPI_FPU_IDL (PAPI_FPU_IDL_idx | PAPI_PRESET_MASK)
#define PAPI_LSU_IDL (PAPI_LSU_IDL_idx | PAPI_PRESET_MASK)
#define PAPI_TLB_DM  (PAPI_TLB_DM_idx  | PAPI_PRESET_MASK)
#define PAPI_TLB_IM  (PAPI_TLB_IM_idx  | PAPI_PRESET_MASK)
#define PAPI_TLB_TL  (PAPI_TLB_TL_idx  | PAPI_PRESET_MASK)
#define PAPI_L1_LDM  (PAPI_L1_LDM_idx  | PAPI_PRESET_MASK)
#define PAPI_L1_STM  (PAPI_L1_STM_idx  | PAPI_PRESET_MASK)
#define PAPI_L2_LDM  (PAPI_L2_LDM_idx  | PAPI_PRESET_MASK)
#define PAPI_L2_STM  (PAPI_L2_STM_idx  | PAPI_PRESET_MASK)
#define PAPI_BTAC_M  (PAPI_BTAC_M_idx  | PAPI_PRESET_MASK)
#define PAPI_PRF_DM  (PAPI_PRF_DM_idx  | PAPI_PRESET_MASK)
#define PAPI_L3_DCH  (PAPI_L3_DCH_idx  | PAPI_PRESET_MASK)
#define PAPI_TLB_SD  (PAPI_TLB_SD_idx  | PAPI_PRESET_MASK)
#define PAPI_CSR_FAL (PAPI_CSR_FAL_idx | PAPI_PRESET_MASK)
#define PAPI_CSR_SUC (PAPI_CSR_SUC_idx | PAPI_PRESET_MASK)
#define PAPI_CSR_TOT (PAPI_CSR_TOT_idx | PAPI_PRESET_MASK)
#define PAPI_MEM_SCY (PAPI_MEM_SCY_idx | PAPI_PRESET_MASK)
#define PAPI_MEM_RCY (PAPI_MEM_RCY_idx | PAPI_PRESET_MASK)
#define PAPI_MEM_WCY (PAPI_MEM_WCY_idx | PAPI_PRESET_MASK)
#define PAPI_STL_ICY (PAPI_STL_ICY_idx | PAPI_PRESET_MASK)
#define PAPI_FUL_ICY (PAPI_FUL_ICY_idx | PAPI_PRESET_MASK)
#define PAPI_STL_CCY (PAPI_STL_CCY_idx | PAPI_PRESET_MASK)
#define PAPI_FUL_CCY (PAPI_FUL_CCY_idx | PAPI_PRESET_MASK)
#define PAPI_HW_INT  (PAPI_HW_INT_idx  | PAPI_PRESET_MASK)
#define PAPI_BR_UCN  (PAPI_BR_UCN_idx  | PAPI_PRESET_MASK)
#define PAPI_BR_CN   (PAPI_BR_CN_idx   | PAPI_PRESET_MASK)
#define PAPI_BR_TKN  (PAPI_BR_TKN_idx  | PAPI_PRESET_MASK)
#define PAPI_BR_NTK  (PAPI_BR_NTK_idx  | PAPI_PRESET_MASK)
#define PAPI_BR_MSP  (PAPI_BR_MSP_idx  | PAPI_PRESET_MASK)
#define PAPI_BR_PRC  (PAPI_BR_PRC_idx  | PAPI_PRESET_MASK)
#define PAPI_FMA_INS (PAPI_FMA_INS_idx | PAPI_PRESET_MASK)
#define PAPI_TOT_IIS (PAPI_TOT_IIS_idx | PAPI_PRESET_MASK)
#define PAPI_TOT_INS (PAPI_TOT_INS_idx | PAPI_PRESET_MASK)
#define PAPI_INT_INS (PAPI_INT_INS_idx | PAPI_PRESET_MASK)
#define PAPI_FP_INS  (PAPI_FP_INS_idx  | PAPI_PRESET_MASK)
#define PAPI_LD_INS  (PAPI_LD_INS_idx  | PAPI_PRESET_MASK)
#define PAPI_SR_INS  (PAPI_SR_INS_idx  | PAPI_PRESET_MASK)
#define PAPI_BR_INS  (PAPI_BR_INS_idx  | PAPI_PRESET_MASK)
#define PAPI_VEC_INS (PAPI_VEC_INS_idx | PAPI_PRESET_MASK)
#define PAPI_RES_STL (PAPI_RES_STL_idx | PAPI_PRESET_MASK)
#define PAPI_FP_STAL (PAPI_FP_STAL_idx | PAPI_PRESET_MASK)
#define PAPI_TOT_CYC (PAPI_TOT_CYC_idx | PAPI_PRESET_MASK)
#define PAPI_LST_INS (PAPI_LST_INS_idx | PAPI_PRESET_MASK)
#define PAPI_SYC_INS (PAPI_SYC_INS_idx | PAPI_PRESET_MASK)
#define PAPI_L1_DCH  (PAPI_L1_DCH_idx  | PAPI_PRESET_MASK)
#define PAPI_L2_DCH  (PAPI_L2_DCH_idx  | PAPI_PRESET_MASK)
#define PAPI_L1_DCA  (PAPI_L1_DCA_idx  | PAPI_PRESET_MASK)
#define PAPI_L2_DCA  (PAPI_L2_DCA_idx  | PAPI_PRESET_MASK)
#define PAPI_L3_DCA  (PAPI_L3_DCA_idx  | PAPI_PRESET_MASK)
#define PAPI_L1_DCR  (PAPI_L1_DCR_idx  | PAPI_PRESET_MASK)
#define PAPI_L2_DCR  (PAPI_L2_DCR_idx  | PAPI_PRESET_MASK)
#define PAPI_L3_DCR  (PAPI_L3_DCR_idx  | PAPI_PRESET_MASK)
#define PAPI_L1_DCW  (PAPI_L1_DCW_idx  | PAPI_PRESET_MASK)
#define PAPI_L2_DCW  (PAPI_L2_DCW_idx  | PAPI_PRESET_MASK)
#define PAPI_L3_DCW  (PAPI_L3_DCW_idx  | PAPI_PRESET_MASK)
#define PAPI_L1_ICH  (PAPI_L1_ICH_idx  | PAPI_PRESET_MASK)
#define PAPI_L2_ICH  (PAPI_L2_ICH_idx  | PAPI_PRESET_MASK)
#define PAPI_L3_ICH  (PAPI_L3_ICH_idx  | PAPI_PRESET_MASK)
#define PAPI_L1_ICA  (PAPI_L1_ICA_idx  | PAPI_PRESET_MASK)
#define PAPI_L2_ICA  (PAPI_L2_ICA_idx  | PAPI_PRESET_MASK)
#define PAPI_L3_ICA  (PAPI_L3_ICA_idx  | PAPI_PRESET_MASK)
#define PAPI_L1_ICR  (PAPI_L1_ICR_idx  | PAPI_PRESET_MASK)
#define PAPI_L2_ICR  (PAPI_L2_ICR_idx  | PAPI_PRESET_MASK)
#define PAPI_L3_ICR  (PAPI_L3_ICR_idx  | PAPI_PRESET_MASK)
#define PAPI_L1_ICW  (PAPI_L1_ICW_idx  | PAPI_PRESET_MASK)
#define PAPI_L2_ICW  (PAPI_L2_ICW_idx  | PAPI_PRESET_MASK)
#define PAPI_L3_ICW  (PAPI_L3_ICW_idx  | PAPI_PRESET_MASK)
#define PAPI_L1_TCH  (PAPI_L1_TCH_idx  | PAPI_PRESET_MASK)
#define PAPI_L2_TCH  (PAPI_L2_TCH_idx  | PAPI_PRESET_MASK)
#define PAPI_L3_TCH  (PAPI_L3_TCH_idx  | PAPI_PRESET_MASK)
#define PAPI_L1_TCA  (PAPI_L1_TCA_idx  | PAPI_PRESET_MASK)
#define PAPI_L2_TCA  (PAPI_L2_TCA_idx  | PAPI_PRESET_MASK)
#define PAPI_L3_TCA  (PAPI_L3_TCA_idx  | PAPI_PRESET_MASK)
#define PAPI_L1_TCR  (PAPI_L1_TCR_idx  | PAPI_PRESET_MASK)
#define PAPI_L2_TCR  (PAPI_L2_TCR_idx  | PAPI_PRESET_MASK)
#define PAPI_L3_TCR  (PAPI_L3_TCR_idx  | PAPI_PRESET_MASK)
#define PAPI_L1_TCW  (PAPI_L1_TCW_idx  | PAPI_PRESET_MASK)
#define PAPI_L2_TCW  (PAPI_L2_TCW_idx  | PAPI_PRESET_MASK)
#define PAPI_L3_TCW  (PAPI_L3_TCW_idx  | PAPI_PRESET_MASK)
#define PAPI_FML_INS (PAPI_FML_INS_idx | PAPI_PRESET_MASK)
#define PAPI_FAD_INS (PAPI_FAD_INS_idx | PAPI_PRESET_MASK)
#define PAPI_FDV_INS (PAPI_FDV_INS_idx | PAPI_PRESET_MASK)
#define PAPI_FSQ_INS (PAPI_FSQ_INS_idx | PAPI_PRESET_MASK)
#define PAPI_FNV_INS (PAPI_FNV_INS_idx | PAPI_PRESET_MASK)
#define PAPI_FP_OPS  (PAPI_FP_OPS_idx  | PAPI_PRESET_MASK)
#define PAPI_SP_OPS  (PAPI_SP_OPS_idx  | PAPI_PRESET_MASK)
#define PAPI_DP_OPS  (PAPI_DP_OPS_idx  | PAPI_PRESET_MASK)
#define PAPI_VEC_SP  (PAPI_VEC_SP_idx  | PAPI_PRESET_MASK)
#define PAPI_VEC_DP  (PAPI_VEC_DP_idx  | PAPI_PRESET_MASK)
#define PAPI_REF_CYC (PAPI_REF_CYC_idx | PAPI_PRESET_MASK)

#define PAPI_END (PAPI_END_idx | PAPI_PRESET_MASK)

#endif
